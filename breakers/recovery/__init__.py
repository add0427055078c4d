"""Automatic recovery after an L3 brake: the verdict with history (``verdict``, pure), the
evidence it is given (``evidence``), and the service that records it and acts on it
(``service``; docs/recovery.md)."""
