"""Harness code that runs INSIDE the sandbox (stdlib only; never imported by postrl).

`judge.py` pastes this source in front of each generated program. Two entry points:

  _rt_candidate(solution_src, probe_src, entry)  - the candidate run: compiles and runs the
      solution, then the *probe* (the test with its expected values removed), recording every
      call of the entry point as plain data: encoded arguments and encoded return value.
  _rt_judge(items)                               - the judge run: never sees the solution;
      replays the recorded return values into the original assertions and reports which held.

Records are written to stdout as lines starting with _RT_MARK. Everything in the candidate run
is forgeable by the candidate, which is why it only ever reports data, never a verdict.
"""

import builtins as _rt_builtins
import json as _rt_json
import os as _rt_os
import random as _rt_random
import sys as _rt_sys

_RT_MARK = "\x1ePOSTRL-RECORD "
_rt_write = _rt_os.write


def _rt_emit(obj):
    data = ("\n" + _RT_MARK + _rt_json.dumps(obj) + "\n").encode("utf-8", "surrogatepass")
    while data:
        data = data[_rt_write(1, data):]


def _rt_enc(x, depth=0):
    """Exact built-in types only; any other object is opaque (and will equal nothing)."""
    if depth > 60:
        return {"__o": "too deep"}
    t = type(x)
    if x is None or t is bool:
        return x
    if isinstance(x, int):
        return int.__int__(x)  # the value, not a subclass with its own __eq__
    if isinstance(x, float):
        return float.__float__(x)
    if isinstance(x, str):
        return str.__str__(x)
    d = depth + 1
    if isinstance(x, list):
        return [_rt_enc(v, d) for v in list.copy(x)]
    if isinstance(x, tuple):
        return {"__t": [_rt_enc(v, d) for v in tuple.__iter__(x)]}
    if isinstance(x, dict):
        return {"__d": [[_rt_enc(k, d), _rt_enc(v, d)] for k, v in dict.items(x)]}
    if isinstance(x, frozenset):
        return {"__s": [_rt_enc(v, d) for v in frozenset.__iter__(x)], "frozen": True}
    if isinstance(x, set):
        return {"__s": [_rt_enc(v, d) for v in set.__iter__(x)]}
    if isinstance(x, bytes):
        return {"__b": bytes.hex(x)}
    if isinstance(x, complex):
        return {"__c": [complex.real.__get__(x), complex.imag.__get__(x)]}
    return {"__o": t.__name__ if isinstance(t.__name__, str) else "?"}


class _RtOpaque:
    """Stands for a value that was not plain data: equal to nothing, not even itself."""

    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError("opaque value")

    def __repr__(self):
        return "<opaque " + str(self.name) + ">"


def _rt_dec(x):
    if isinstance(x, list):
        return [_rt_dec(v) for v in x]
    if not isinstance(x, dict):
        return x
    if "__t" in x:
        return tuple(_rt_dec(v) for v in x["__t"])
    if "__d" in x:
        return {_rt_dec(k): _rt_dec(v) for k, v in x["__d"]}
    if "__s" in x:
        items = [_rt_dec(v) for v in x["__s"]]
        return frozenset(items) if x.get("frozen") else set(items)
    if "__b" in x:
        return bytes.fromhex(x["__b"])
    if "__c" in x:
        return complex(*x["__c"])
    return _RtOpaque(x.get("__o", "?"))


def _rt_dumps(args, kwargs):
    try:
        return _rt_json.dumps([_rt_enc(list(args)), _rt_enc(dict(kwargs))], sort_keys=True)
    except Exception as e:  # e.g. an unhashable or unprintable argument
        return "unencodable: " + type(e).__name__


class _RtHidden:
    """Replaces an expected value in the probe: every comparison holds, arithmetic absorbs,
    so the probe follows the same path through the test as a passing solution would."""

    def _t(self, *a):
        return True

    def _s(self, *a):
        return self

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __contains__ = _t
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _s
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __abs__ = __neg__ = _s
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = __getitem__ = __call__ = _s
    __hash__ = object.__hash__

    def __bool__(self):
        return True

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0


_RT_H = _RtHidden()


def _rt_probe(thunk):
    try:
        thunk()
    except BaseException:
        pass


class _RtRecorder:
    def __init__(self, fn):
        self.fn = fn
        self.n = 0

    def __call__(self, *args, **kwargs):
        i = self.n
        self.n += 1
        enc_args = _rt_dumps(args, kwargs)  # before the call: the callee may mutate them
        state = _rt_random.getstate()  # the candidate's use of `random` must not shift the test's
        try:
            ret = self.fn(*args, **kwargs)
        except BaseException as e:
            _rt_random.setstate(state)
            _rt_emit({"call": i, "args": enc_args, "exc": type(e).__name__})
            raise
        _rt_random.setstate(state)
        try:
            enc = _rt_enc(ret)
        except Exception:
            enc = {"__o": "unencodable"}
        _rt_emit({"call": i, "args": enc_args, "ret": enc})
        return ret


def _rt_exit():
    for stream in (_rt_sys.stdout, _rt_sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    _rt_os._exit(0)  # no atexit handlers, no waiting for the candidate's threads


def _rt_candidate(src, probe, entry):
    try:
        code = compile(src, "solution.py", "exec")
    except BaseException as e:
        _rt_emit({"compiled": False, "error": (type(e).__name__ + ": " + str(e))[:300]})
        _rt_exit()
    _rt_emit({"compiled": True})
    ns = {"__name__": "__solution__", "__builtins__": _rt_builtins}
    try:
        exec(code, ns)
    except BaseException as e:
        _rt_emit({"module_error": type(e).__name__})
        _rt_exit()
    fn = ns.get(entry)
    if not callable(fn):
        _rt_emit({"module_error": "no function " + entry})
        _rt_exit()
    ns.update(_rt_probe=_rt_probe, _RT_H=_RT_H)
    exec(compile(probe, "test.py", "exec"), ns)
    _rt_random.seed(0)
    try:
        ns["check"](_RtRecorder(fn))
    except BaseException as e:
        _rt_emit({"check_error": type(e).__name__})
    _rt_emit({"done": True})
    _rt_exit()


class _RtRaised(Exception):
    pass


class _RtReplay:
    def __init__(self, calls):
        self.calls = calls
        self.n = 0
        self.diverged = ""

    def __call__(self, *args, **kwargs):
        i = self.n
        self.n += 1
        if i >= len(self.calls):
            self.diverged = self.diverged or f"call {i} was not made by the candidate run"
            raise _RtRaised("missing call")
        c = self.calls[i]
        if _rt_dumps(args, kwargs) != c.get("args"):
            self.diverged = self.diverged or f"call {i}: arguments differ from the candidate run"
            raise _RtRaised("diverged")
        if "exc" in c:
            raise _RtRaised(str(c["exc"]))
        return _rt_dec(c.get("ret"))


def _rt_judge_one(prompt, test, calls_json):
    ns = {"__name__": "__solution__", "__builtins__": _rt_builtins}
    try:
        # The problem's own text (signature, docstring, helpers the test may call).
        exec(compile(prompt, "prompt.py", "exec"), ns)
    except BaseException:
        pass
    results = []

    def _rt_assert(thunk):
        try:
            results.append(bool(thunk()) is True)
        except BaseException:
            results.append(False)

    ns["_rt_assert"] = _rt_assert
    replay = _RtReplay(_rt_json.loads(calls_json))
    error = None
    try:
        exec(compile(test, "test.py", "exec"), ns)
        _rt_random.seed(0)
        ns["check"](replay)
    except BaseException as e:
        error = type(e).__name__
    return {"judge": results, "check_error": error, "consumed": replay.n, "diverged": replay.diverged}


def _rt_judge(items_json):
    """Judge several solutions in one run: [[prompt, test, calls_json], ...]. This process runs
    only problem text and recorded data, so problems can share it."""
    for index, (prompt, test, calls_json) in enumerate(_rt_json.loads(items_json)):
        rec = _rt_judge_one(prompt, test, calls_json)
        rec["index"] = index
        _rt_emit(rec)
    _rt_exit()
