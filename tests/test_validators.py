"""Each setting's check at its edges: the value it gives back (and its type), or the exact message a user reads after
the setting's name. The scripts print these messages as they are, so a changed word is a changed promise."""

from __future__ import annotations

import typing
from typing import Any, Literal

import pytest

from project.config import tool_args, trainer_args
from project.config import validators as v
from project.errors import UsageError


def built(factory, *args):
    """A check a factory makes, made when it is called: one made while the tests are collected would miss a change
    to its factory made later (mutmut's)."""
    return lambda value: factory(*args)(value)


SIZES_OF_2 = built(v.sizes_of, 2, "8,16")
OPTIONAL_COUNT = built(v.optional, v.positive_int)

ACCEPTED = [
    (v.positive_int, "3", 3), (v.positive_int, 1, 1),
    (v.non_negative_int, 0, 0), (v.non_negative_int, "5", 5),
    (v.positive_float, "0.5", 0.5), (v.positive_float, 2, 2.0),
    (v.learning_rate, v.FLOAT32_MAX, v.FLOAT32_MAX), (v.learning_rate, "1e-3", 0.001),
    (v.non_negative_float, 0, 0.0), (v.non_negative_float, "2.5", 2.5),
    (v.memory_fraction, 1, 1.0), (v.memory_fraction, "0.25", 0.25),
    (v.flag, True, True), (v.flag, False, False), (v.flag, "TRUE", True), (v.flag, "false", False),
    (v.flag, "False", False),
    (v.flag_or_auto, " Auto ", "auto"), (v.flag_or_auto, "true", True), (v.flag_or_auto, False, False),
    (v.folder_name, "run-1", "run-1"), (v.folder_name, "v1.2", "v1.2"), (v.folder_name, "...", "..."),
    (v.folder_name, "x-", "x-"), (v.folder_name, "a" * 100, "a" * 100), (v.folder_name, "é" * 50, "é" * 50),
    (v.folder_name, 7, "7"),
    (v.text, 5, "5"), (v.text, 1.5, "1.5"), (v.text, "words", "words"),
    (v.sizes, "128", [128]), (v.sizes, "256, 128", [256, 128]), (v.sizes, [8, 16], [8, 16]), (v.sizes, ",8,", [8]),
    (v.sizes, 64, [64]),
    (SIZES_OF_2, "8,16", [8, 16]),
    (v.size_or_share, 0.1, 0.1), (v.size_or_share, "0.5", 0.5), (v.size_or_share, 0.999, 0.999),
    (v.size_or_share, 5000, 5000), (v.size_or_share, "5000", 5000), (v.size_or_share, 1, 1), (v.size_or_share, "1", 1),
    (v.devices_spec, "0,1", [0, 1]), (v.devices_spec, "1,", [1]), (v.devices_spec, "0,", [0]),
    (v.devices_spec, [0, 2], [0, 2]), (v.devices_spec, "auto", "auto"), (v.devices_spec, " auto ", "auto"),
    (v.devices_spec, 2, 2), (v.devices_spec, "-1", -1), (v.devices_spec, 1, 1),
    (OPTIONAL_COUNT, None, None), (OPTIONAL_COUNT, "3", 3),
    (v.count_or_auto, "auto", "auto"), (v.count_or_auto, " auto", "auto"), (v.count_or_auto, 4, 4),
    (v.seed_value, 0, 0), (v.seed_value, 2**32 - 1, 4294967295), (v.seed_value, "42", 42),
    (v.top_k, -1, -1), (v.top_k, 0, 0), (v.top_k, "3", 3),
]


@pytest.mark.parametrize(("check", "value", "expected"), ACCEPTED)
def test_a_good_value_comes_back_typed(check, value, expected):
    got = check(value)
    assert (type(got), got) == (type(expected), expected)


REFUSED = [
    (v.positive_int, 0, "must be a positive integer, got 0"),
    (v.positive_int, -2, "must be a positive integer, got -2"),
    (v.positive_int, True, "not a valid int: True"),
    (v.positive_int, 2.0, "not a valid int: 2.0"),
    (v.positive_int, "x", "not a valid int: 'x'"),
    (v.positive_int, None, "not a valid int: None"),
    (v.non_negative_int, -1, "must be zero or more, got -1"),
    (v.positive_float, 0, "must be a positive number, got 0"),
    (v.positive_float, "inf", "must be a positive number, got inf"),
    (v.positive_float, "nan", "must be a positive number, got nan"),
    (v.positive_float, True, "not a valid float: True"),
    (v.positive_float, "fast", "not a valid float: 'fast'"),
    (v.learning_rate, "3.5e38", "must fit a float32 (at most 3.4e+38), got 3.5e38"),
    (v.learning_rate, -0.1, "must be a positive number, got -0.1"),
    (v.non_negative_float, -0.1, "must be zero or more, got -0.1"),
    (v.non_negative_float, "inf", "must be zero or more, got inf"),
    (v.memory_fraction, 0, "must be in (0, 1], got 0"),
    (v.memory_fraction, 1.5, "must be in (0, 1], got 1.5"),
    (v.flag, "yes", "must be true or false, got 'yes'"),
    (v.flag, 1, "must be true or false, got 1"),
    (v.flag_or_auto, "maybe", "must be true or false, got 'maybe'"),
    (v.folder_name, "", "must be one plain folder name, got ''"),
    (v.folder_name, ".", "must be one plain folder name, got '.'"),
    (v.folder_name, "..", "must be one plain folder name, got '..'"),
    (v.folder_name, "a/b", "must be one plain folder name, got 'a/b'"),
    (v.folder_name, "a\\b", "must be one plain folder name, got 'a\\\\b'"),
    (v.folder_name, "a\0b", "must be one plain folder name, got 'a\\x00b'"),
    (v.folder_name, "-x", "must be one plain folder name, got '-x'"),
    (v.folder_name, "a" * 101, "must be at most 100 bytes long, got 101"),
    (v.folder_name, "é" * 51, "must be at most 100 bytes long, got 102"),
    (v.folder_name, None, "must be a string, got None"),
    (v.text, True, "must be a string, got True"),
    (v.text, [1], "must be a string, got [1]"),
    (v.text, None, "must be a string, got None"),
    (v.sizes, "", "needs at least one size, e.g. 128 or 256,128"),
    (v.sizes, True, "needs at least one size, e.g. 128 or 256,128"),
    (v.sizes, "8,0", "must be a positive integer, got 0"),
    (SIZES_OF_2, "8", "needs exactly 2 sizes, e.g. 8,16; got 1"),
    (SIZES_OF_2, "8,16,32", "needs exactly 2 sizes, e.g. 8,16; got 3"),
    (v.size_or_share, True, "expected a count or a share between 0 and 1, got True"),
    (v.size_or_share, "x", "expected a count or a share between 0 and 1, got 'x'"),
    (v.size_or_share, 0, "expected a count or a share between 0 and 1, got 0"),
    (v.size_or_share, 1.5, "expected a count or a share between 0 and 1, got 1.5"),
    (v.size_or_share, 1.0, "expected a count or a share between 0 and 1, got 1.0"),
    (v.size_or_share, "0.0", "expected a count or a share between 0 and 1, got '0.0'"),
    (v.devices_spec, 0, "device count must be >= 1 (or -1 for all), got 0"),
    (v.devices_spec, -2, "device count must be >= 1 (or -1 for all), got -2"),
    (v.devices_spec, "a,b", "device indices must be integers, got 'a,b'"),
    (v.devices_spec, [True], "device indices must be integers, got [True]"),
    (v.devices_spec, "0,0", "device indices must be distinct and >= 0, got '0,0'"),
    (v.devices_spec, "-1,0", "device indices must be distinct and >= 0, got '-1,0'"),
    (v.devices_spec, [], "device indices must be distinct and >= 0, got []"),
    (v.devices_spec, "AUTO", "not a valid int: 'AUTO'"),
    (OPTIONAL_COUNT, "0", "must be a positive integer, got 0"),
    (v.count_or_auto, 0, "must be a positive integer, got 0"),
    (v.count_or_auto, "Auto", "not a valid int: 'Auto'"),
    (v.seed_value, 2**32, "must be between 0 and 4294967295, got 4294967296"),
    (v.seed_value, -1, "must be between 0 and 4294967295, got -1"),
    (v.top_k, -2, "must be -1 (all), 0 or more, got -2"),
]


@pytest.mark.parametrize(("check", "value", "message"), REFUSED)
def test_a_bad_value_is_refused_with_its_message(check, value, message):
    with pytest.raises(ValueError) as refused:
        check(value)
    assert str(refused.value) == message


LOGGERS = built(v.names_from, "csv", "tensorboard")


@pytest.mark.parametrize(("value", "result"), [
    ("csv", "csv"), (" csv , tensorboard ", "csv,tensorboard"), ("csv,,tensorboard", "csv,tensorboard"),
    ("", "choose from csv, tensorboard (comma-separated), got ''"),
    ("wandb", "choose from csv, tensorboard (comma-separated), got 'wandb'"),
    ("csv,wandb", "choose from csv, tensorboard (comma-separated), got 'csv,wandb'"),
    ("csv tensorboard", "choose from csv, tensorboard (comma-separated), got 'csv tensorboard'"),
    ("csv,csv", "csv is named twice in 'csv,csv'"),
    ("tensorboard,csv,tensorboard", "tensorboard is named twice in 'tensorboard,csv,tensorboard'"),
])
def test_names_from_a_list_each_at_most_once(value, result):
    try:
        assert LOGGERS(value) == result
    except ValueError as refused:
        assert str(refused) == result


def test_one_of_takes_a_choice_as_text_and_never_a_boolean():
    check = v.one_of("True", "b")
    assert check("b") == "b"
    with pytest.raises(ValueError, match=r"^invalid choice: 'True' \(choose from True, b\)$"):
        check(True)
    with pytest.raises(ValueError, match=r"^invalid choice: 'c' \(choose from True, b\)$"):
        check("c")


def test_a_check_made_for_a_count_of_sizes_is_named_as_sizes():
    assert v.sizes_of(2, "8,16").__name__ == "sizes"  # argparse names the check in its own messages


def test_a_long_value_is_quoted_cut_short():
    assert v.shown("x" * 100) == "'" + "x" * 27 + "..." + "x" * 28 + "'"  # 60 characters
    with pytest.raises(ValueError, match=r"^must be true or false, got 'x{27}\.\.\.x{28}'$"):
        v.flag("x" * 100)


def test_figure_and_report_paths_that_can_be_written_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert tool_args.image_file("a.PNG") == "a.PNG"
    assert tool_args.output_folder("new/deeper") == "new/deeper"  # made later


@pytest.mark.parametrize(("check", "value", "message"), [
    (tool_args.image_file, "a.txt", "'a.txt': name a .png, .pdf, .svg, .jpg, .jpeg file"),
    (tool_args.image_file, "gone/a.png", "'gone/a.png': the folder gone does not exist"),
    (tool_args.output_folder, "afile", "'afile': is a file, not a folder"),
    (tool_args.output_folder, "afile/sub",
     "cannot write the reports in afile/sub (afile is not a folder this user can write in)"),
])
def test_a_figure_or_report_path_that_cannot_be_written_is_refused(tmp_path, monkeypatch, check, value, message):
    monkeypatch.chdir(tmp_path)  # short paths: a message quotes a long one cut short
    (tmp_path / "afile").write_text("")
    (tmp_path / "afile").chmod(0o755)  # one a user may write and run: still not a folder
    with pytest.raises(ValueError) as refused:
        check(value)
    assert str(refused.value) == message


TRAINER_REFUSED = [
    ({"logger": False}, "--trainer.logger: set by the template; use --logger"),
    ({"default_root_dir": "x"}, "--trainer.default_root_dir: set by the template; use --logdir"),
    ({"max_epoch": 3}, "--trainer.max_epoch: not an argument of lightning.Trainer (did you mean max_epochs?)"),
    ({"zzzz": 1}, "--trainer.zzzz: not an argument of lightning.Trainer"),
    ({"self": 1}, "--trainer.self: not an argument of lightning.Trainer"),
    ({"benchmark": "yes"}, "--trainer.benchmark: expected bool, null, got 'yes'"),
    ({"max_time": "00:00:00:00"}, "--trainer.max_time: must be a positive length of time, got '00:00:00:00'"),
    ({"max_time": "1:2:3"}, "--trainer.max_time: must be DD:HH:MM:SS, got '1:2:3'"),
    ({"max_time": "aa:00:00:01"}, "--trainer.max_time: must be DD:HH:MM:SS, got 'aa:00:00:01'"),
    ({"max_time": {"hours": 0}}, "--trainer.max_time: must be a positive length of time, got {'hours': 0}"),
    ({"max_time": {"seconds": float("inf")}},
     "--trainer.max_time: must be a positive length of time, got {'seconds': inf}"),
    ({"max_time": {"hours": True}}, "--trainer.max_time: must map weeks, days, hours, minutes, seconds, milliseconds, "
                                    "microseconds to numbers, got {'hours': True}"),
    ({"max_time": {"fortnights": 1}}, "--trainer.max_time: must map weeks, days, hours, minutes, seconds, "
                                      "milliseconds, microseconds to numbers, got {'fortnights': 1}"),
    ({"gradient_clip_val": -1}, "--trainer.gradient_clip_val: must be a finite number, 0 or more, got -1"),
    ({"gradient_clip_val": float("inf")},
     "--trainer.gradient_clip_val: must be a finite number, 0 or more, got inf"),
    ({"limit_train_batches": 1.5}, "--trainer.limit_train_batches: a share must be in [0, 1], got 1.5"),
    ({"limit_val_batches": -1}, "--trainer.limit_val_batches: a count of batches must be 0 or more, got -1"),
    ({"accumulate_grad_batches": 0}, "--trainer.accumulate_grad_batches: must be 1 or more, got 0"),
    ({"max_steps": 0}, "--trainer.max_steps: must be -1 (no limit) or 1 or more, got 0"),
]


@pytest.mark.parametrize(("values", "message"), TRAINER_REFUSED)
def test_a_bad_trainer_argument_is_one_line(values, message):
    with pytest.raises(UsageError) as refused:
        trainer_args.check_trainer_args(values)
    assert str(refused.value) == message


@pytest.mark.parametrize("values", [
    {"max_time": "01:02:03:04"}, {"max_time": {"milliseconds": 500}}, {"max_time": {"hours": 1.5, "minutes": 2}},
    {"max_time": None}, {"gradient_clip_val": 0}, {"limit_train_batches": 0.0}, {"limit_train_batches": 1.0},
    {"limit_val_batches": 0}, {"accumulate_grad_batches": 1}, {"max_steps": -1}, {"max_steps": 1},
    {"benchmark": True}, {"benchmark": None},
])
def test_a_good_trainer_argument_passes_as_it_is(values):
    assert trainer_args.check_trainer_args(values) == values


@pytest.mark.parametrize(("key", "values", "changes"), [
    ("limit_train_batches", {"limit_train_batches": 1.0}, False),  # None means 1.0: all batches
    ("limit_train_batches", {"limit_train_batches": 1}, True),  # one batch
    ("limit_train_batches", {}, False),
    ("gradient_clip_algorithm", {"gradient_clip_algorithm": "norm"}, False),
    ("gradient_clip_algorithm", {"gradient_clip_algorithm": "value"}, True),
    ("num_sanity_val_steps", {"num_sanity_val_steps": 0}, True),
    ("max_epochs", {"max_epochs": None}, False),
    ("max_epochs", {"max_epochs": 3}, True),
])
def test_a_value_changes_the_default_only_when_the_trainer_would_use_another(key, values, changes):
    assert v.changes_the_default(key, values) is changes


def test_the_trainers_own_default_is_what_a_value_is_compared_with():
    assert (v.trainer_default("num_nodes"), v.trainer_default("inference_mode")) == (1, True)
    assert (v.trainer_default("limit_val_batches"), v.trainer_default("max_epochs")) == (1.0, None)
    assert v.trainer_default("no_such_argument") is None
    assert v.changes_the_default("num_nodes", {"num_nodes": 2})
    assert not v.changes_the_default("num_nodes", {"num_nodes": 1})
    assert not v.changes_the_default("inference_mode", {"inference_mode": True})
    assert v.same_trainer_value("max_epochs", 1, 1.0)  # a count is a count, however written
    assert not v.same_trainer_value("val_check_interval", 1, 1.0)  # one batch, or the whole epoch
    assert not v.same_trainer_value("limit_test_batches", 1.0, 1)
    assert v.same_trainer_value("limit_test_batches", 0.5, 0.5)


@pytest.mark.parametrize(("value", "hint", "fits"), [
    (1, Literal[1, 2], True), (True, Literal[1, True], False), (3, Literal[1, 2], False),
    (None, int | None, True), (0, None, False), (True, bool, True), (1, bool, False),
    (True, int, False), (1, float, True), (1.5, int, False), (1.5, float, True), ("x", str, True), (1, str, False),
    ([1, 2], list[int], True), ([1, "a"], list[int], False), ("x", list[int], False),
    ([1, "a"], typing.List, True),  # noqa: UP006 - a list of anything, as a signature without item types says it
    ({}, dict[str, int], True), ([], dict[str, int], False), (3, Any, True), (object(), int | str, False),
])
def test_fits_takes_only_what_the_hint_allows(value, hint, fits):
    assert trainer_args.fits(value, hint) is fits


@pytest.mark.parametrize(("hint", "words"), [
    (int | None, "int, null"), (float | int, "int, float"), (int | float, "int, float"),
    (str | bool, "bool, str"), (list[int], "a list"), (dict[str, int], "a mapping"),
    (Literal["a", "b"] | None, "'a', 'b', null"), (Literal["a"] | int, "int, 'a'"),
    (Literal["a"] | Literal["a", "b"], "'a', 'b'"),
    (object, "a Python object (set it in code)"),
])
def test_a_hint_is_described_in_plain_words(hint, words):
    assert trainer_args.describe(hint) == words


@pytest.mark.parametrize(("value", "typed"), [([8, 16], "8,16"), ((32,), "32"), (0.1, "0.1"), ("adamw", "adamw"),
                                              (True, "True")])
def test_a_value_is_shown_as_it_is_typed_after_its_flag(value, typed):
    """One rule for --help's defaults, a resume's adopted settings, the summary's options and the recipe checks."""
    assert v.flag_value(value) == typed
