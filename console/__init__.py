"""The web layer: pages, the REST API, websockets. Project settings live in ``config``."""
