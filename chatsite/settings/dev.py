"""Local development: DEBUG on, insecure defaults allowed."""

from .base import *  # noqa: F401,F403
from .base import env

DEBUG = env.bool("DEBUG", default=True)
