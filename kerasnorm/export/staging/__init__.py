"""Atomic writes (`atomic`): an artifact is written beside its target and
moved into place only once it verified."""
