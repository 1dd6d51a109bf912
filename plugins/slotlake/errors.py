"""The few exception classes slotlake raises. Messages say what happened and what to do."""


class SlotlakeError(Exception):
    """Base class: the CLI prints `str(err)` as one line and exits non-zero."""


class ConfigError(SlotlakeError):
    """The YAML config is invalid; the message names the key and the fix."""


class PreflightError(SlotlakeError):
    """The source database is not ready (version, wal_level, rights, publication, slot)."""


class SlotLostError(PreflightError):
    """The replication slot is missing or invalidated; the only way on is a resync."""


class ExtractError(SlotlakeError):
    """Reading changes from the slot or archiving them to bronze failed."""


class DecodeError(SlotlakeError):
    """A pgoutput frame could not be decoded."""


class MergeError(SlotlakeError):
    """Changes could not be applied to a gold table (e.g. no usable replica identity)."""


class SnapshotError(SlotlakeError):
    """The initial copy of a table (or a resync) failed; the message names the table and the reason."""


class SourceBusyError(SlotlakeError):
    """Another run holds the source's run lock (see slotlake.source.lock); the message names it."""


class RecoverError(SlotlakeError):
    """A recovery cannot run as asked (point not covered, target exists, unknown table, ...)."""
