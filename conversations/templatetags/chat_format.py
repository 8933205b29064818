"""Template filters of the chat page."""

from django import template

register = template.Library()


@register.filter
def seconds(milliseconds) -> str:
    """``1234`` (ms) -> ``"1.2 s"``, as the page's script writes it for a live reply."""
    try:
        return f"{int(milliseconds) / 1000:.1f} s"
    except (TypeError, ValueError):
        return ""
