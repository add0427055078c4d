"""Re-export: the non-finite float column lives in ``incidents.fields`` (incidents' alerts store
metric values too, and incidents must not import breakers). Kept because migrations name it
``breakers.fields.NonFiniteFloatField``."""

from incidents.fields import NonFiniteFloatField

__all__ = ["NonFiniteFloatField"]
