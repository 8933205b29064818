"""Built-in guards. A guard is any class with ``name``, ``version`` and ``check(text, context) -> GuardResult``
(:class:`safety.guards.base.Guard`); ``settings.SAFETY_GUARDS`` lists them by dotted path, like middleware."""

from safety.guards.base import Guard, GuardContext, GuardResult

__all__ = ["Guard", "GuardContext", "GuardResult"]
