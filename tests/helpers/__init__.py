"""Shared test helpers: apps in process, Redis servers, host environments."""
