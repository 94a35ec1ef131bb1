"""Exceptions raised by the state stores."""

from streamplatform.exceptions import StreamPlatformError


class StateStoreError(StreamPlatformError):
    """A state store operation that cannot be carried out (closed store, pending prepare, ...)."""


class StoreLockedError(StateStoreError):
    """The store's directory is held by another open store, in this process or another one."""
