"""Unit tests (pure logic). A package, so test file names may repeat tests/integration/."""
