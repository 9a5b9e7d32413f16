"""The typed getters every bundle and plan-cache read goes through (dslc/runtime/fields.py), one
by one: what each accepts up to its exact bounds, and the one sentence it raises otherwise,
naming the field's path and quoting what was found. Expected messages are written out here."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dslc.runtime import fields as f
from dslc.runtime.fields import BundleError


def refused(message: str) -> Any:
    """pytest.raises for a BundleError whose whole message is `message`."""
    return pytest.raises(BundleError, match="^" + re.escape(message) + "$")


@pytest.mark.parametrize(("value", "shown"), [
    (None, "none"), (True, "true"), (False, "false"),
    ("ab", '"ab"'), ("x" * 40, '"' + "x" * 40 + '"'), ("x" * 41, '"' + "x" * 40 + '..."'),
    (7, "7"), (2.5, "2.5"), (10**23, "100000000000000000000000"),
    (10**24, "a 25-digit number"), (b"abc", "3 bytes"), (bytearray(2), "2 bytes"),
    ([1, 2], "a list of 2"), ((1,), "a list of 1"), ({"a": 1}, "a map"), ({1}, "a set"),
])
def test_a_found_value_is_quoted_briefly(value: Any, shown: str) -> None:
    assert f.show(value) == shown


def test_a_map_needs_string_keys_its_required_fields_and_no_unknown_one() -> None:
    assert f.mapping({"a": 1}, "p", ("a",), ("b",)) == {"a": 1}
    assert f.mapping({"a": 1, "zz": 2}, "p", ("a",)) == {"a": 1, "zz": 2}  # no `optional`: any
    with refused("p: expected a map, got a list of 0"):
        f.mapping([], "p")
    with refused("p: a key 3 is not a string"):
        f.mapping({"a": 1, 3: 2}, "p")
    with refused("p: missing field `b`"):
        f.mapping({"a": 1}, "p", ("a", "b"))
    with refused("p: unknown field `c`"):
        f.mapping({"a": 1, "c": 2}, "p", ("a",), ("b",))
    with refused("p: unknown field `" + "k" * 40 + "`"):
        f.mapping({"k" * 50: 1}, "p", (), ())


def test_a_map_or_a_list_of_more_than_max_items_entries_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(f, "MAX_ITEMS", 4)  # a map's bound is read at each call
        assert len(f.mapping(dict.fromkeys("abcd", 0), "p")) == 4
        with refused("p: 5 entries, more than 4"):
            f.mapping(dict.fromkeys("abcde", 0), "p")
    assert len(f.items([0] * f.MAX_ITEMS, "p")) == f.MAX_ITEMS
    with refused(f"p: {f.MAX_ITEMS + 1} entries, expected 0..{f.MAX_ITEMS}"):
        f.items([0] * (f.MAX_ITEMS + 1), "p")


def test_a_list_has_between_lo_and_hi_entries() -> None:
    assert f.items([1, 2], "p", 2, 2) == [1, 2]
    with refused("p: 1 entries, expected 2..3"):
        f.items([1], "p", 2, 3)
    with refused("p: 4 entries, expected 2..3"):
        f.items([1, 2, 3, 4], "p", 2, 3)
    with refused("p: expected a list, got a list of 1"):
        f.items((1,), "p")  # a tuple is not what msgpack gives for a list


def test_an_int_is_an_int_within_its_bounds_inclusive() -> None:
    assert f.integer(0, "p") == 0 and f.integer(f.MAX_ELEMENTS, "p") == f.MAX_ELEMENTS
    assert f.integer(-3, "p", -3, 3) == -3 and f.integer(3, "p", -3, 3) == 3
    with refused(f"p: expected an int in 0..{f.MAX_ELEMENTS}, got -1"):
        f.integer(-1, "p")
    with refused(f"p: expected an int in 0..{f.MAX_ELEMENTS}, got {f.MAX_ELEMENTS + 1}"):
        f.integer(f.MAX_ELEMENTS + 1, "p")
    with refused("p: expected an int in -3..3, got 4"):
        f.integer(4, "p", -3, 3)
    with refused("p: expected a non-negative int, got true"):
        f.integer(True, "p")
    with refused("p: expected an int, got 1.0"):
        f.integer(1.0, "p", -3, 3)
    assert f.opt_integer(None, "p") is None and f.opt_integer(5, "p", 5, 5) == 5
    with refused("p: expected an int in 0..4, got 5"):
        f.opt_integer(5, "p", 0, 4)
    with refused(f"p: expected an int in 0..{f.MAX_ELEMENTS}, got -1"):
        f.opt_integer(-1, "p")


def test_a_number_is_an_int_or_a_float_never_a_bool() -> None:
    assert f.number(3, "p") == 3.0 and type(f.number(3, "p")) is float
    assert f.number(0.5, "p") == 0.5
    with refused("p: expected a number, got true"):
        f.number(True, "p")
    with refused('p: expected a number, got "1"'):
        f.number("1", "p")
    assert f.opt_number(None, "p") is None and f.opt_number(2, "p") == 2.0
    with refused("p: expected a number, got false"):
        f.opt_number(False, "p")


def test_a_text_is_a_string_of_at_most_hi_characters_and_one_of_its_choices() -> None:
    assert f.text("x" * f.MAX_TEXT, "p") == "x" * f.MAX_TEXT
    with refused(f"p: expected a string of at most {f.MAX_TEXT} characters, got "
                 '"' + "x" * 40 + '..."'):
        f.text("x" * (f.MAX_TEXT + 1), "p")
    assert f.text("abc", "p", hi=3) == "abc"
    with refused('p: expected a string of at most 2 characters, got "abc"'):
        f.text("abc", "p", hi=2)
    with refused("p: expected a string of at most 65536 characters, got 3 bytes"):
        f.text(b"abc", "p")
    assert f.text("b", "p", {"b", "a"}) == "b"
    with refused('p: expected one of a, b, c, got "d"'):
        f.text("d", "p", {"c", "a", "b"})
    assert f.opt_text(None, "p") is None and f.opt_text("a", "p", {"a"}) == "a"
    with refused('p: expected one of a, got "b"'):
        f.opt_text("b", "p", {"a"})


def test_a_flag_is_true_or_false_only() -> None:
    assert f.flag(True, "p") is True and f.flag(False, "p") is False
    with refused("p: expected true or false, got 1"):
        f.flag(1, "p")
    assert f.opt_flag(None, "p") is None and f.opt_flag(False, "p") is False
    with refused("p: expected true or false, got 0"):
        f.opt_flag(0, "p")


def test_a_blob_is_bytes_of_at_most_max_blob(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f, "MAX_BLOB", 8)  # the bound read at each call, without 256 MiB here
    assert f.blob(None, "p") is None and f.blob(bytes(8), "p") == bytes(8)
    with refused('p: expected bytes (at most 8), got "x"'):
        f.blob("x", "p")
    with refused("p: expected bytes (at most 8), got 9 bytes"):
        f.blob(bytes(9), "p")


def test_a_name_must_be_one_the_data_defines() -> None:
    assert f.name_of("a", "p", {"a"}) == "a"
    with refused("p: `b` is not a value of the graph"):
        f.name_of("b", "p", {"a"})
    with refused("p: `" + "n" * 60 + "` is not a step"):
        f.name_of("n" * 70, "p", set(), "a step")
    assert f.names(["a", "a"], "p", {"a"}) == ("a", "a")
    assert f.names([], "p", {"a"}) == ()
    with refused("p[1]: `b` is not a value of the graph"):
        f.names(["a", "b"], "p", {"a"})
    with refused("p[0]: `b` is not a value of the graph"):
        f.names(["b", "c"], "p", {"a"})  # none of them known
    with refused("p[0]: `x` is not a step"):
        f.names(["x"], "p", {"a"}, "a step")
    with refused("p: 0 entries, expected 1..1048576"):
        f.names([], "p", {"a"}, lo=1)
    with refused("p[0]: expected a string of at most 65536 characters, got 1"):
        f.names([1], "p", {"a"})
    with refused("p: expected a list, got a list of 1"):
        f.names(("a",), "p", {"a"})


def test_ints_are_checked_each_and_in_number() -> None:
    assert f.ints([0, f.MAX_ELEMENTS], "p") == (0, f.MAX_ELEMENTS)
    assert f.ints([1] * f.MAX_RANK, "p") == (1,) * f.MAX_RANK
    assert f.ints([2, 3], "p", 2, 3, 2, 2) == (2, 3)
    with refused("p[1]: expected an int in 2..3, got 4"):
        f.ints([2, 4], "p", 2, 3)
    with refused("p[0]: expected an int in 2..3, got 1"):
        f.ints([1], "p", 2, 3)
    with refused(f"p: {f.MAX_RANK + 1} entries, expected 0..{f.MAX_RANK}"):
        f.ints([1] * (f.MAX_RANK + 1), "p")
    with refused("p: 1 entries, expected 2..3"):
        f.ints([1], "p", n_lo=2, n_hi=3)
    with refused("p[0]: expected a non-negative int, got true"):
        f.ints([True], "p")
    with refused("p: expected a list, got a list of 2"):
        f.ints((1, 2), "p")  # a tuple of fine ints is still no list


def test_an_int_map_has_short_string_keys_and_bounded_values() -> None:
    assert f.int_map({"a": -(2**31), "b": 2**31 - 1}, "p") == {"a": -(2**31), "b": 2**31 - 1}
    with refused(f"p.a: expected an int in {-(2**31)}..{2**31 - 1}, got {2**31}"):
        f.int_map({"a": 2**31}, "p")
    with refused(f"p.a: expected an int in {-(2**31)}..{2**31 - 1}, got {-(2**31) - 1}"):
        f.int_map({"a": -(2**31) - 1}, "p")
    with refused("p.a: expected an int in 0..5, got 6"):
        f.int_map({"a": 6}, "p", 0, 5)
    assert f.int_map({"k" * 128: 1}, "p") == {"k" * 128: 1}
    with refused("p: expected a string of at most 128 characters, got \"" + "k" * 40 + '..."'):
        f.int_map({"k" * 129: 1}, "p")


def test_an_attribute_value_is_plain_data_nested_a_little() -> None:
    value = [1, -2.5, "s", True, None, [[[0]]]]  # four lists deep
    assert f.plain(value, "p") == value
    assert f.plain(f.MAX_ELEMENTS, "p") == f.MAX_ELEMENTS
    assert f.plain(-f.MAX_ELEMENTS, "p") == -f.MAX_ELEMENTS
    assert f.plain(True, "p") is True  # a bool is no int of any magnitude
    with refused(f"p: expected an int of magnitude at most {f.MAX_ELEMENTS}, got "
                 f"{-f.MAX_ELEMENTS - 1}"):
        f.plain(-f.MAX_ELEMENTS - 1, "p")
    with refused("p[0][0][0][0]: expected a number, string, bool, none or list, got a list of 0"):
        f.plain([[[[[]]]]], "p")  # five
    with refused("p[1]: expected a number, string, bool, none or list, got a map"):
        f.plain([0, {}], "p")
    assert len(f.plain([0] * 4096, "p")) == 4096
    with refused("p: 4097 entries, expected 0..4096"):
        f.plain([0] * 4097, "p")
    with refused("p[0]: expected a string of at most 65536 characters, got \"" + "x" * 40 +
                 '..."'):
        f.plain(["x" * (f.MAX_TEXT + 1)], "p")
