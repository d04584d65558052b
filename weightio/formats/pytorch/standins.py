"""Stand-ins for the non-torch objects real training checkpoints hold, each surfacing as plain data.

Lightning, Hydra and Hugging Face's Trainer save more than tensors: hyper-parameters as
OmegaConf containers or Lightning's ``AttributeDict``, ``TrainingArguments`` with enums, the torch
version, paths, ``defaultdict``s and dates. Each global below is an allowlisted stand-in (an inert,
immutable object of `.inert`: a `Function` or a `FrozenClass` class, shared by every pickle) that
records what the pickle passes and never imports or calls the library it names:

=====================================================  ==========================================
global                                                  surfaces in ``metadata`` as
=====================================================  ==========================================
``omegaconf.dictconfig.DictConfig``                     a dict of its values (``${…}``
``omegaconf.listconfig.ListConfig``                     interpolations and ``???`` kept as text),
``omegaconf.nodes.*Node``, ``omegaconf.base.*Metadata``  a list; node metadata is dropped
Lightning's ``AttributeDict`` (every spelling)          a dict
``TrainingArguments``, ``AcceleratorConfig``,           a dict of the object's attributes
``PartialState`` … (`RECORDS`)
``torch.torch_version.TorchVersion``                    its version string
``pathlib`` paths (Posix, Windows, Pure*)               the path as a string (its own separator)
``collections.defaultdict``                             a dict (``default_factory`` never called;
                                                        its name kept as ``.default_factory``)
``datetime.datetime`` / ``date`` / ``time``             ISO 8601 text (``2024-05-06T07:08:09+02:00``)
``datetime.timedelta``                                  ISO 8601 duration ``P<days>DT<seconds>S``
``datetime.timezone``                                   its name (``UTC``, ``UTC+02:00``)
the enums of `ENUMS` (transformers, accelerate,          the member's value (``"steps"``)
Lightning)
``typing.Any`` …, ``builtins.dict`` … as values         their dotted name
=====================================================  ==========================================

Class stand-ins are built by NEWOBJ, which calls ``__new__`` only; a dict-like one takes its items
by SETITEMS and its attributes by BUILD (checked as `.refs.check_state` checks any state: string
names, no dunders). No stand-in allocates by a number from the file, and none builds a tuple or a
frozenset from a container's items (see `.allowlist`).
"""

from __future__ import annotations

import datetime
import ntpath
import posixpath
from typing import Any

from ...errors import CorruptFileError
from .inert import FrozenClass, Function, Token
from .refs import check_state, short_repr

__all__ = ["ENUMS", "RECORDS", "DefaultDict", "plain_time", "training_objects"]

_SCALARS = (str, int, float, bool, type(None))


def _empty(base: type[object], cls: type[Any], args: tuple) -> Any:
    """What NEWOBJ (``cls.__new__(cls, *args)``) makes of a class stand-in (`cls`, of metaclass
    `FrozenClass`): an empty `base` instance, filled later by SETITEMS / BUILD; arguments are refused."""
    if args:
        raise CorruptFileError(f"{cls.allowlisted_as} takes no positional arguments")
    return base.__new__(cls)


# ----------------------------------------------------------------------------- dict-like records


class Record(dict, metaclass=FrozenClass):
    """A dataclass-like object (``TrainingArguments``) or a dict subclass (``AttributeDict``): a
    dict of its items (SETITEMS) and attributes (BUILD)."""

    __slots__ = ()
    allowlisted_as = "a record"
    accepts_items = True  # SETITEM(S) on an instance is how dict subclasses pickle (tests/test_pickle.py)

    def __new__(cls, *args: Any) -> Record:
        return _empty(dict, cls, args)

    def __init__(self, *args: Any) -> None:
        """Nothing: NEWOBJ never calls it, and ``dict.__init__`` would take items from the pickle."""

    def __setstate__(self, state: Any) -> None:
        check_state(state, f"the state of {type(self).allowlisted_as}")
        parts = state if isinstance(state, tuple) else (state,)
        for part in parts:
            if part:
                self.update(part)


def _record_class(module: str, name: str) -> type:
    return FrozenClass(name, (Record,), {"__slots__": (), "allowlisted_as": f"{module}.{name}",
                                         "__module__": __name__, "__qualname__": f"Record[{module}.{name}]"})


# dataclass-like objects and dict subclasses, by module: their attributes become a dict.
RECORDS: dict[str, tuple[str, ...]] = {
    "transformers.training_args": ("TrainingArguments",),
    "transformers.training_args_seq2seq": ("Seq2SeqTrainingArguments",),
    "transformers.trainer_pt_utils": ("AcceleratorConfig",),
    "transformers.generation.configuration_utils": ("GenerationConfig",),
    "accelerate.state": ("PartialState", "AcceleratorState"),
    "lightning.fabric.utilities.data": ("AttributeDict",),
    "lightning_fabric.utilities.data": ("AttributeDict",),
    "lightning.pytorch.utilities.parsing": ("AttributeDict",),
    "pytorch_lightning.utilities.parsing": ("AttributeDict",),
}


class DefaultDict(dict):
    """What ``collections.defaultdict(factory)`` becomes: a dict (SETITEMS fill it); the factory
    is never called, only named (``default_factory``: ``"builtins.list"``, or None)."""

    __slots__ = ("default_factory",)
    default_factory: str | None


def _defaultdict(factory: Any = None, *rest: Any) -> DefaultDict:
    if rest:
        raise CorruptFileError("collections.defaultdict takes one argument (the factory)")
    d = DefaultDict()
    d.default_factory = None if factory is None else short_repr(factory)
    return d


# ----------------------------------------------------------------------------- OmegaConf


class OmegaNode(metaclass=FrozenClass):
    """An OmegaConf value node (``AnyNode`` …): its ``_val``; metadata and parent are dropped."""

    __slots__ = ("value",)
    allowlisted_as = "omegaconf.nodes.AnyNode"
    bounded_repr = True

    def __new__(cls, *args: Any) -> OmegaNode:
        obj = _empty(object, cls, args)
        obj.value = None
        return obj

    def __setstate__(self, state: Any) -> None:
        check_state(state, f"the state of {type(self).allowlisted_as}")
        if isinstance(state, dict):
            self.value = state.get("_val")

    def __repr__(self) -> str:
        return f"<{type(self).allowlisted_as}>"


class OmegaMetadata(metaclass=FrozenClass):
    """``omegaconf.base.Metadata`` / ``ContainerMetadata``: checked, then dropped."""

    __slots__ = ()
    allowlisted_as = "omegaconf.base.Metadata"
    bounded_repr = True

    def __new__(cls, *args: Any) -> OmegaMetadata:
        return _empty(object, cls, args)

    def __setstate__(self, state: Any) -> None:
        check_state(state, f"the state of {type(self).allowlisted_as}")

    def __repr__(self) -> str:
        return f"<{type(self).allowlisted_as}>"


def _content(state: Any, what: str) -> Any:
    check_state(state, f"the state of {what}")
    return state.get("_content") if isinstance(state, dict) else None


def _unwrap(value: Any) -> Any:
    return value.value if isinstance(value, OmegaNode) else value


class DictConfig(dict, metaclass=FrozenClass):
    """``omegaconf.dictconfig.DictConfig``: a dict of its values (nested configs stay configs)."""

    __slots__ = ()
    allowlisted_as = "omegaconf.dictconfig.DictConfig"
    accepts_items = True

    def __new__(cls, *args: Any) -> DictConfig:
        return _empty(dict, cls, args)

    def __init__(self, *args: Any) -> None:
        """Nothing (see `Record.__init__`)."""

    def __setstate__(self, state: Any) -> None:
        content = _content(state, self.allowlisted_as)
        if isinstance(content, dict):  # copied before the update: the content may be this very config
            self.update([(k, _unwrap(v)) for k, v in content.items()])


class ListConfig(list, metaclass=FrozenClass):
    """``omegaconf.listconfig.ListConfig``: a list of its values."""

    __slots__ = ()
    allowlisted_as = "omegaconf.listconfig.ListConfig"
    accepts_items = True

    def __new__(cls, *args: Any) -> ListConfig:
        return _empty(list, cls, args)

    def __init__(self, *args: Any) -> None:
        """Nothing (see `Record.__init__`)."""

    def __setstate__(self, state: Any) -> None:
        content = _content(state, self.allowlisted_as)
        if isinstance(content, list):  # copied before extending: a config whose content is itself (through
            self.extend([_unwrap(v) for v in content])  # the memo) would otherwise grow while read, forever


_OMEGA_NODES = ("AnyNode", "StringNode", "IntegerNode", "FloatNode", "BooleanNode", "EnumNode", "PathNode",
                "BytesNode", "UnionNode", "ValueNode", "InterpolationResultNode")


def _subclass(base: type, module: str, name: str) -> type:
    return FrozenClass(name, (base,), {"__slots__": (), "allowlisted_as": f"{module}.{name}",
                                       "__module__": __name__, "__qualname__": f"{base.__name__}[{module}.{name}]"})


# ----------------------------------------------------------------------------- strings: version, paths


class TorchVersion(metaclass=FrozenClass):
    """``torch.torch_version.TorchVersion`` (a str subclass, built by NEWOBJ): the plain string."""

    __slots__ = ()
    allowlisted_as = "torch.torch_version.TorchVersion"

    def __new__(cls, *args: Any) -> Any:  # NEWOBJ pushes what __new__ returns: a plain str
        if len(args) != 1 or not isinstance(args[0], str):
            raise CorruptFileError(f"torch.torch_version.TorchVersion takes one string, found {short_repr(args)}")
        return str(args[0])


def _path(join: Any, what: str) -> Any:
    def path(*parts: Any) -> str:
        if not all(isinstance(p, str) for p in parts):
            raise CorruptFileError(f"{what} takes strings, found {short_repr(parts)}")
        return join(*parts) if parts else "."

    return path


_PATHS = {"PosixPath": posixpath.join, "PurePosixPath": posixpath.join, "Path": posixpath.join,
          "PurePath": posixpath.join, "WindowsPath": ntpath.join, "PureWindowsPath": ntpath.join}


# ----------------------------------------------------------------------------- datetime


def _int_args(args: tuple, what: str) -> tuple[int, ...]:
    if not all(type(a) is int for a in args):
        raise CorruptFileError(f"{what} takes integers, found {short_repr(args)}")
    return args


def _state_bytes(state: Any, size: int, what: str) -> bytes:
    if isinstance(state, str):  # Python 2 pickles: the bytes as latin-1 text
        state = state.encode("latin1", "replace")
    if not isinstance(state, bytes) or len(state) != size:
        raise CorruptFileError(f"{what} state must be {size} bytes, found {short_repr(state)}")
    return state


def _tz(tz: Any, what: str) -> datetime.tzinfo | None:
    if tz is None or isinstance(tz, datetime.timezone):
        return tz
    raise CorruptFileError(f"{what}: time zone {short_repr(tz)} is not a datetime.timezone")


def _build(what: str, make: Any, *args: Any) -> Any:
    try:
        return make(*args)
    except (ValueError, OverflowError, TypeError) as e:
        raise CorruptFileError(f"{what}{short_repr(args, 120)} is not a valid value ({e})") from None


def _datetime(state: Any = None, *rest: Any) -> str:
    """``datetime.datetime``: pickled as (10 bytes[, tzinfo]), or (y, m, d, …) by hand: ISO text."""
    what = "datetime.datetime"
    if type(state) is int:
        return _build(what, datetime.datetime, *_int_args((state, *rest), what)).isoformat()
    if len(rest) > 1:
        raise CorruptFileError(f"{what} takes its state and a time zone")
    b = _state_bytes(state, 10, what)
    fields = ((b[0] << 8) | b[1], b[2] & 0x7F, b[3], b[4], b[5], b[6], (b[7] << 16) | (b[8] << 8) | b[9])
    tz = _tz(rest[0] if rest else None, what)
    return _build(what, datetime.datetime, *fields, tz).isoformat()


def _date(state: Any = None, *rest: Any) -> str:
    what = "datetime.date"
    if type(state) is int:
        return _build(what, datetime.date, *_int_args((state, *rest), what)).isoformat()
    b = _state_bytes(state, 4, what)
    return _build(what, datetime.date, (b[0] << 8) | b[1], b[2], b[3]).isoformat()


def _time(state: Any = None, *rest: Any) -> str:
    what = "datetime.time"
    if type(state) is int:
        return _build(what, datetime.time, *_int_args((state, *rest), what)).isoformat()
    if len(rest) > 1:
        raise CorruptFileError(f"{what} takes its state and a time zone")
    b = _state_bytes(state, 6, what)
    fields = (b[0] & 0x7F, b[1], b[2], (b[3] << 16) | (b[4] << 8) | b[5])
    return _build(what, datetime.time, *fields, _tz(rest[0] if rest else None, what)).isoformat()


def _timedelta(days: Any = 0, seconds: Any = 0, microseconds: Any = 0) -> datetime.timedelta:
    what = "datetime.timedelta"
    return _build(what, datetime.timedelta, *_int_args((days, seconds, microseconds), what))


def _timezone(offset: Any = None, name: Any = None) -> datetime.timezone:
    what = "datetime.timezone"
    if not isinstance(offset, datetime.timedelta) or not (name is None or isinstance(name, str)):
        raise CorruptFileError(f"{what} takes a timedelta and a name, found {short_repr((offset, name))}")
    return _build(what, datetime.timezone, *((offset,) if name is None else (offset, name)))


def plain_time(value: Any) -> str | None:
    """The plain form of what the datetime stand-ins pass between them, or None for other values:
    a timedelta as an ISO 8601 duration (``P1DT5.000007S``), a timezone as its name."""
    if isinstance(value, datetime.timedelta):
        fraction = f".{value.microseconds:06d}" if value.microseconds else ""
        return f"P{value.days}DT{value.seconds}{fraction}S"
    if isinstance(value, datetime.timezone):
        return value.tzname(None)
    return None


# ----------------------------------------------------------------------------- enums


def _enum(module: str, name: str) -> Function:
    def member(value: Any = None, *rest: Any) -> Any:
        if rest or not isinstance(value, _SCALARS):
            raise CorruptFileError(f"enum {module}.{name} takes one plain value, found {short_repr((value, *rest))}")
        return value

    return Function(module, name, member, "enum")


# enum classes real checkpoints hold (pickled as REDUCE(class, (value,))): the member's value.
ENUMS: dict[str, tuple[str, ...]] = {
    "transformers.trainer_utils": ("IntervalStrategy", "SaveStrategy", "HubStrategy", "SchedulerType",
                                   "EvaluationStrategy", "FSDPOption", "HPSearchBackend"),
    "transformers.training_args": ("OptimizerNames", "ParallelMode"),
    "transformers.debug_utils": ("DebugOption",),
    "transformers.utils.generic": ("PaddingStrategy", "TensorType"),
    "accelerate.utils.dataclasses": ("DistributedType", "DynamoBackend", "PrecisionType", "RNGType",
                                     "ComputeEnvironment", "LoggerType"),
    "lightning.pytorch.trainer.states": ("TrainerFn", "RunningStage", "TrainerStatus"),
    "pytorch_lightning.trainer.states": ("TrainerFn", "RunningStage", "TrainerStatus"),
}

# types and typing forms that OmegaConf metadata (and other records) hold as values.
_TYPES = {"builtins": ("dict", "list", "int", "str", "float", "bool", "object", "tuple"),
          "__builtin__": ("dict", "list", "int", "long", "str", "unicode", "float", "bool", "object", "tuple"),
          "typing": ("Any", "Dict", "List", "Tuple", "Optional", "Union")}


# ----------------------------------------------------------------------------- the table


def training_objects() -> dict[tuple[str, str], Any]:
    """The allowlist entries of this module: ``(module, name)`` -> its stand-in."""
    table: dict[tuple[str, str], Any] = {}
    for module, names in RECORDS.items():
        for name in names:
            table[(module, name)] = _record_class(module, name)
    table[("omegaconf.dictconfig", "DictConfig")] = DictConfig
    table[("omegaconf.listconfig", "ListConfig")] = ListConfig
    for name in _OMEGA_NODES:
        table[("omegaconf.nodes", name)] = _subclass(OmegaNode, "omegaconf.nodes", name)
    for name in ("Metadata", "ContainerMetadata"):
        table[("omegaconf.base", name)] = _subclass(OmegaMetadata, "omegaconf.base", name)
    table[("torch.torch_version", "TorchVersion")] = TorchVersion
    for module in ("pathlib", "pathlib._local"):  # pathlib._local: Python 3.13+
        for name, join in _PATHS.items():
            table[(module, name)] = Function(module, name, _path(join, f"{module}.{name}"), "path")
    table[("collections", "defaultdict")] = Function("collections", "defaultdict", _defaultdict)
    for name, call in (("datetime", _datetime), ("date", _date), ("time", _time), ("timedelta", _timedelta),
                       ("timezone", _timezone)):
        table[("datetime", name)] = Function("datetime", name, call, "datetime")
    for module, names in ENUMS.items():
        for name in names:
            table[(module, name)] = _enum(module, name)
    for module, names in _TYPES.items():
        for name in names:
            table[(module, name)] = Token(module, name, "type")
    return table
