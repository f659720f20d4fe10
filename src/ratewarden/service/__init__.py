"""The HTTP daemon: app factory, routes, error shapes."""

from ratewarden.service.app import create_app

__all__ = ["create_app"]
