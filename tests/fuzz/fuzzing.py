"""What the fuzz tests share: the example budget, outcome counts, and strategies for protobuf messages.

CI runs every fuzz test with ``BUDGET`` examples (the ``bpuemu-ci`` hypothesis
profile, derandomized so CI failures reproduce); ``bench/fuzz.py --minutes N``
runs the same properties (``properties()`` in each module) for as long as asked.

A property's check returns the name of its outcome ("loaded", "refused", ...).
``run_counted`` runs a property and counts the outcomes, so that a test can
assert that its examples reach the code under test (a fuzzer whose every
example stops at the first check fuzzes nothing behind it).

``messages(descriptor)`` draws any well-typed message of a proto type: every
scalar field from its full range, repeated fields of a few items, nested
messages to a bounded depth. ``overrides`` bias chosen fields (by name) toward
values the server knows (a stored model's SHA-256, real dtypes).
"""
import collections
import os
from typing import Callable, Dict

from google.protobuf.descriptor import FieldDescriptor as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

#: Examples per fuzz test in CI. All fuzz tests together stay within ~2.5 minutes.
BUDGET = int(os.environ.get("BPUEMU_FUZZ_EXAMPLES", "400"))

settings.register_profile("bpuemu-ci", max_examples=BUDGET, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.function_scoped_fixture])


def run_counted(strategy, check: Callable, max_examples: int = 0) -> collections.Counter:
    """Run the property (``check`` returns its outcome's name) under the active profile, with
    ``max_examples`` if given; outcome -> examples."""
    outcomes = collections.Counter()

    def counted(example):
        outcomes[check(example)] += 1

    test = given(strategy)(counted)
    if max_examples:
        test = settings(max_examples=max_examples)(test)
    test()
    return outcomes


def assert_share(outcomes: collections.Counter, wanted, at_least: float) -> None:
    """At least the fraction ``at_least`` of the examples ended in one of the ``wanted`` outcomes."""
    wanted = {wanted} if isinstance(wanted, str) else set(wanted)
    total = sum(outcomes.values())
    got = sum(n for k, n in outcomes.items() if k in wanted)
    assert total and got >= at_least * total, (
        f"only {got} of {total} examples ended {' or '.join(sorted(map(str, wanted)))} "
        f"(wanted >= {at_least:.0%}): {dict(outcomes.most_common())}")


_SCALARS = {
    F.TYPE_INT32: st.integers(-(2**31), 2**31 - 1), F.TYPE_SINT32: st.integers(-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: st.integers(-(2**31), 2**31 - 1), F.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    F.TYPE_SINT64: st.integers(-(2**63), 2**63 - 1), F.TYPE_SFIXED64: st.integers(-(2**63), 2**63 - 1),
    F.TYPE_UINT32: st.integers(0, 2**32 - 1), F.TYPE_FIXED32: st.integers(0, 2**32 - 1),
    F.TYPE_UINT64: st.integers(0, 2**64 - 1), F.TYPE_FIXED64: st.integers(0, 2**64 - 1),
    F.TYPE_BOOL: st.booleans(), F.TYPE_STRING: st.text(max_size=40), F.TYPE_BYTES: st.binary(max_size=256),
    F.TYPE_FLOAT: st.floats(width=32), F.TYPE_DOUBLE: st.floats(),
}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@st.composite
def unknown_fields(draw) -> bytes:
    """Wire bytes of 1..3 fields that no message here defines (numbers 1000+): what a newer client may send."""
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        number = draw(st.integers(1000, 2**29 - 1))
        wire = draw(st.sampled_from([0, 1, 2, 5]))
        payload = {0: lambda: _varint(draw(st.integers(0, 2**64 - 1))), 1: lambda: draw(st.binary(min_size=8, max_size=8)),
                   2: lambda: (lambda b: _varint(len(b)) + b)(draw(st.binary(max_size=64))),
                   5: lambda: draw(st.binary(min_size=4, max_size=4))}[wire]()
        out += _varint(number << 3 | wire) + payload
    return out


def with_unknown_fields(messages_strategy) -> st.SearchStrategy:
    """The messages of ``messages_strategy``, each with unknown fields added."""
    def add(pair):
        msg, extra = pair
        msg.MergeFromString(extra)
        return msg

    return st.tuples(messages_strategy, unknown_fields()).map(add)


def messages(descriptor, overrides: Dict[str, st.SearchStrategy] = None, depth: int = 3) -> st.SearchStrategy:
    """Any message of ``descriptor``'s type, as a protobuf object."""
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(descriptor)
    overrides = overrides or {}
    fields = {}
    for f in descriptor.fields:
        if f.name in overrides:
            value = overrides[f.name]
        elif f.type == F.TYPE_MESSAGE:
            if depth <= 0:
                continue
            value = messages(f.message_type, overrides, depth - 1)
        elif f.type == F.TYPE_ENUM:
            value = st.one_of(st.sampled_from([v.number for v in f.enum_type.values]), st.integers(-5, 100))
        else:
            value = _SCALARS[f.type]
        if f.is_repeated and f.name not in overrides:
            value = st.lists(value, max_size=4)
        fields[f.name] = st.one_of(st.none(), value)

    @st.composite
    def build(draw):
        msg = cls()
        for name, strategy in fields.items():
            value = draw(strategy)
            if value is None:
                continue
            f = descriptor.fields_by_name[name]
            if f.is_repeated:
                target = getattr(msg, name)
                if f.type == F.TYPE_MESSAGE:
                    for v in value:
                        target.add().CopyFrom(v)
                else:
                    target.extend(value)
            elif f.type == F.TYPE_MESSAGE:
                getattr(msg, name).CopyFrom(value)
            else:
                setattr(msg, name, value)
        return msg

    return build()


def _field_slots(msg, prefix=""):
    """Every (message, field) pair in ``msg``, nested messages included (set ones only)."""
    slots = []
    for f in msg.DESCRIPTOR.fields:
        slots.append((msg, f))
        if f.type == F.TYPE_MESSAGE:
            if f.is_repeated:
                for sub in getattr(msg, f.name):
                    slots.extend(_field_slots(sub))
            elif msg.HasField(f.name):
                slots.extend(_field_slots(getattr(msg, f.name)))
    return slots


@st.composite
def mutated(draw, original, max_mutations: int = 3):
    """A copy of the message ``original`` with 1..max_mutations fields changed to absurd or random values."""
    msg = type(original)()
    msg.CopyFrom(original)
    for _ in range(draw(st.integers(1, max_mutations))):
        slots = _field_slots(msg)
        if not slots:
            break
        owner, f = slots[draw(st.integers(0, len(slots) - 1))]
        target = getattr(owner, f.name)
        if f.is_repeated:
            action = draw(st.sampled_from(["clear", "repeat", "append"] if len(target) else ["append"]))
            if action == "clear":
                del target[:]
            elif action == "repeat":  # absurd counts: the same entry many times
                times = draw(st.sampled_from([2, 100, 5000]))
                items = list(target)
                for _ in range(times):
                    if f.type == F.TYPE_MESSAGE:
                        target.add().CopyFrom(items[0])
                    else:
                        target.append(items[0])
            elif f.type == F.TYPE_MESSAGE:
                target.add().CopyFrom(draw(messages(f.message_type, depth=1)))
            elif f.type == F.TYPE_ENUM:
                target.append(draw(st.integers(-5, 100)))
            else:
                target.append(draw(_SCALARS[f.type]))
        elif f.type == F.TYPE_MESSAGE:
            if draw(st.booleans()):
                owner.ClearField(f.name)
            else:
                target.CopyFrom(draw(messages(f.message_type, depth=1)))
        elif f.type == F.TYPE_ENUM:
            setattr(owner, f.name, draw(st.integers(-5, 100)))
        else:
            setattr(owner, f.name, draw(_SCALARS[f.type]))
    return msg
