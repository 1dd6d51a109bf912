"""The Airflow plugin that adds the slotlake view to the Airflow UI (Airflow 3.1+: `fastapi_apps`, `external_views`).

Registered through the package's entry point (`[project.entry-points."airflow.plugins"]` in pyproject.toml), so
an installed slotlake (`pip install`, or the checkout's editable install) brings it to every Airflow process; the
checkout's plugins folder does not load it (plugins/.airflowignore skips the package: Airflow would import each of
its files as a top-level module). Importing this module is cheap and has no side effect: the web app, and with
it FastAPI, the config and any I/O, is built when the API server first asks for `fastapi_apps`.
"""
from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/slotlake"  # the app's mount point on the API server (slotlake.airflow.status_app.URL_PREFIX)


class SlotlakePlugin(AirflowPlugin):
    name = "slotlake"
    # A nav entry on the toolbar itself (not in the Plugins submenu) that shows the app's page inside the UI, as an
    # iframe at <ui>/plugin/slotlake. The href has no leading slash: the UI resolves it against its base URL, so
    # it works under a URL prefix too.
    external_views = [{"name": "slotlake", "href": "slotlake/", "destination": "nav", "url_route": "slotlake",
                       "nav_top_level": True}]

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]  # a property: built on first use
        from slotlake.airflow.status_app import status_app

        return [{"app": status_app(), "url_prefix": URL_PREFIX, "name": "slotlake"}]
