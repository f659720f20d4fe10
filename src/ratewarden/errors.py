"""Every error ratewarden raises on purpose derives from `RatewardenError`.

    RatewardenError
    ├── PolicyError           policy/errors.py    a policy file or text that cannot be used;
    │                                             `issues` names file, line and field
    ├── StoreError            store/base.py       the store could not answer in time
    │   └── CircuitOpenError  store/breaker.py    refused at once while the circuit is open
    ├── StoreURLError         store/__init__.py   a store URL that cannot be used (ValueError)
    ├── StateFileError        store/snapshot.py   the memory store's state file is unusable
    ├── CallIdConflict        engine/engine.py    a call_id used for another call, or settled
    ├── ClientError           client.py           the daemon refused a request (a 4xx)
    └── DaemonUnavailable     client.py           the daemon did not answer (or a 5xx)

Catch `RatewardenError` to handle any of them; the leaves say which. This module imports
nothing, so a host agent can catch the client's errors without loading the daemon.
"""

from __future__ import annotations


class RatewardenError(Exception):
    """The base of every error ratewarden raises on purpose (the tree is above)."""
