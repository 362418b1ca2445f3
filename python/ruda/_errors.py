"""ruda's exceptions: ruda.Error and one subclass per RUDA_E* code.

Each carries what the C error object holds: ``code`` (the negative
RUDA_E* value), ``name`` ("RUDA_EINVAL"), ``message`` (the call and the
values involved), ``stream`` (the stream id it belongs to; 0 for an error
raised at the call), ``command`` (the command number the message names, or
None), ``backend_code`` (the raw CUresult/nvrtcResult, or 0), ``cause``
(the error that caused it, also set as ``__cause__``) and ``errors`` (the
rest of the list, for an error that lists a stream's queued failures).
"""

import re

from . import _ruda

__all__ = ["Error"]

_COMMAND = re.compile(r"command #(\d+)")


class Error(Exception):
    """A failed ruda call, or a failure a stream's worker queued."""

    code = 0
    name = "RUDA_UNKNOWN"

    def __init__(self, message="", stream=0, backend_code=0, cause=None, errors=()):
        super().__init__(message)
        self.message = message
        self.stream = stream
        self.backend_code = backend_code
        self.cause = cause
        self.errors = list(errors)
        m = _COMMAND.search(message)
        self.command = int(m.group(1)) if m else None
        if cause is not None:
            self.__cause__ = cause

    def all(self):
        """This error's queued failures in order: its cause, then the list."""
        out = [self.cause] if self.cause is not None else []
        return out + self.errors

    def __str__(self):
        return f"{self.name}: {self.message}"


# Codes that also belong to a Python built-in family.
_ALSO = {
    "EINVAL": (ValueError,),
    "ERANGE": (IndexError,),
    "ENOMEM": (MemoryError,),
    "ETIMEDOUT": (TimeoutError,),
    "EKERNEL": (LookupError,),
    "ENOTFOUND": (LookupError,),
    "EIO": (OSError,),
}

_by_code = {}
for _name, (_code, _text) in sorted(_ruda._codes().items(), key=lambda kv: -kv[1][0]):
    _cls = type(_name, (Error,) + _ALSO.get(_name, ()),
                {"code": _code, "name": "RUDA_" + _name, "__doc__": f"RUDA_{_name}: {_text}.",
                 "__module__": "ruda"})
    globals()[_name] = _cls
    __all__.append(_name)
    _by_code[_code] = _cls


def _from_c(code, message, stream, backend_code, cause, errors):
    cls = _by_code.get(code, Error)
    e = cls(message, stream, backend_code, cause, errors)
    if cls is Error:
        e.code = code
    return e
