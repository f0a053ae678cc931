"""Config merging and files (mistk_rl.rl.config) and schedules (mistk_rl.rl.schedules)."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mistk_rl.rl.config import AgentConfigError, deep_merge, load_config_file, save_config
from mistk_rl.rl.schedules import (
    ConstantSchedule,
    ExponentialSchedule,
    LinearSchedule,
    constant,
    exponential,
    linear,
    make_schedule,
)

DEFAULTS = {
    "policy": {
        "learn": {"batch_size": 64, "lr": 1e-3, "update_per_collect": 3},
        "collect": {"n_sample": 8, "eps": {"type": "exp", "start": 0.95}},
        "model": {},  # open: any model kwargs
        "cuda": False,
        "discount": 0.97,
    },
    "buffer": {"size": 10000, "name": None, "kind": "naive"},
}


# ---- deep_merge -----------------------------------------------------------------------------


def test_no_user_config_gives_a_copy_of_the_defaults():
    merged = deep_merge(DEFAULTS, None)
    assert merged == DEFAULTS
    merged["policy"]["learn"]["batch_size"] = 1
    assert DEFAULTS["policy"]["learn"]["batch_size"] == 64


def test_user_overrides_scalars_and_keeps_sibling_defaults():
    merged = deep_merge(DEFAULTS, {"policy": {"learn": {"lr": 3e-4}, "cuda": True}})
    assert merged["policy"]["learn"] == {"batch_size": 64, "lr": 3e-4, "update_per_collect": 3}
    assert merged["policy"]["cuda"] is True
    assert merged["policy"]["collect"] == DEFAULTS["policy"]["collect"]
    assert merged["buffer"] == DEFAULTS["buffer"]


def test_nested_dicts_merge_recursively():
    merged = deep_merge(DEFAULTS, {"policy": {"collect": {"eps": {"start": 1.0}}}})
    assert merged["policy"]["collect"] == {"n_sample": 8, "eps": {"type": "exp", "start": 1.0}}


def test_non_dict_values_replace_whole():
    merged = deep_merge({"sizes": [64, 64]}, {"sizes": [128]})
    assert merged == {"sizes": [128]}


def test_unknown_key_names_full_path_valid_keys_and_suggestion():
    with pytest.raises(AgentConfigError) as info:
        deep_merge(DEFAULTS, {"policy": {"learn": {"batchsize": 32}}})
    message = str(info.value)
    assert "'policy.learn.batchsize'" in message
    for key in ("batch_size", "lr", "update_per_collect"):
        assert key in message
    assert "Did you mean 'batch_size'?" in message


def test_unknown_key_without_close_match_has_no_suggestion():
    with pytest.raises(AgentConfigError, match="top-level keys: policy, buffer") as info:
        deep_merge(DEFAULTS, {"zzzzzz": 1})
    assert "Did you mean" not in str(info.value)


def test_open_dict_accepts_any_keys_at_any_depth():
    model = {"hidden_sizes": [128, 128, 64], "dueling": True, "extra": {"deep": {"x": 1}}}
    merged = deep_merge(DEFAULTS, {"policy": {"model": model}})
    assert merged["policy"]["model"] == model
    assert merged["policy"]["model"] is not model


def test_dict_default_rejects_a_scalar():
    with pytest.raises(AgentConfigError, match=r"policy\.learn: expected a mapping, got int"):
        deep_merge(DEFAULTS, {"policy": {"learn": 5}})


def test_empty_section_keeps_defaults():  # YAML `learn:` with nothing under it is None
    assert deep_merge(DEFAULTS, {"policy": {"learn": None}}) == DEFAULTS


@pytest.mark.parametrize(
    "user, path, expected, got",
    [
        ({"policy": {"cuda": "yes"}}, "policy.cuda", "bool", "str"),
        ({"policy": {"cuda": 1}}, "policy.cuda", "bool", "int"),
        ({"policy": {"learn": {"lr": "1e-3"}}}, "policy.learn.lr", "float", "str"),
        ({"policy": {"learn": {"batch_size": "64"}}}, "policy.learn.batch_size", "int", "str"),
        ({"policy": {"learn": {"batch_size": 64.5}}}, "policy.learn.batch_size", "int", "float"),
        ({"policy": {"learn": {"batch_size": True}}}, "policy.learn.batch_size", "int", "bool"),
    ],
)
def test_type_errors_name_path_expected_and_got(user, path, expected, got):
    with pytest.raises(AgentConfigError) as info:
        deep_merge(DEFAULTS, user)
    assert str(info.value).startswith(f"{path}: expected {expected}, got {got}")


@pytest.mark.parametrize(
    "user",
    [
        {"policy": {"discount": 1}},  # an int stands in for a float
        {"buffer": {"name": {"any": "thing"}}},  # a None default accepts anything
        {"buffer": {"kind": None}},  # str defaults are not type-checked
        {"policy": {"learn": {"lr": math.inf}}},
    ],
)
def test_accepted_types(user):
    deep_merge(DEFAULTS, user)


def test_inputs_are_not_mutated():
    defaults, user = copy.deepcopy(DEFAULTS), {"policy": {"model": {"a": [1]}, "cuda": True}}
    user_before = copy.deepcopy(user)
    merged = deep_merge(defaults, user)
    merged["policy"]["model"]["a"].append(2)
    assert defaults == DEFAULTS and user == user_before


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5))
trees = st.recursive(
    json_leaf,
    lambda children: st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=20,
)


@given(trees.filter(lambda t: isinstance(t, dict)))
def test_merging_a_tree_over_itself_changes_nothing(tree):
    before = copy.deepcopy(tree)
    assert deep_merge(tree, tree) == before
    assert tree == before


# ---- files ----------------------------------------------------------------------------------


def test_save_load_round_trip_keeps_order_inf_and_tuples(tmp_path):
    config = {
        "z_first": 1,
        "policy": {
            "lr": 1e-10,
            "stop": math.inf,
            "low": -math.inf,
            "sizes": (64, 64),
            "name": None,
            "on": True,
        },
    }
    path = tmp_path / "total_config.yaml"
    save_config(config, path)
    text = path.read_text()
    assert ".inf" in text and "-.inf" in text
    assert text.index("z_first") < text.index("policy")  # insertion order, not sorted
    loaded = load_config_file(path)
    assert loaded == {**config, "policy": {**config["policy"], "sizes": [64, 64]}}
    assert [p.name for p in tmp_path.iterdir()] == ["total_config.yaml"]  # no temp file left


def test_save_replaces_existing_file(tmp_path):
    path = tmp_path / "c.yaml"
    save_config({"a": 1}, path)
    save_config({"b": 2}, path)
    assert load_config_file(path) == {"b": 2}


def test_load_reads_exponent_floats_without_a_dot(tmp_path):
    path = tmp_path / "c.yml"
    path.write_text("lr: 1e-3\nbig: 2E5\nname: e5\nversion: 1.2.3\nn: 10\n")
    assert load_config_file(path) == {
        "lr": 1e-3,
        "big": 2e5,
        "name": "e5",
        "version": "1.2.3",
        "n": 10,
    }


def test_load_json_and_empty_yaml(tmp_path):
    (tmp_path / "c.json").write_text('{"policy": {"lr": 0.1, "stop": Infinity}}')
    assert load_config_file(tmp_path / "c.json") == {"policy": {"lr": 0.1, "stop": math.inf}}
    (tmp_path / "empty.yaml").write_text("")
    assert load_config_file(tmp_path / "empty.yaml") == {}


@pytest.mark.parametrize(
    "name, text, match",
    [
        ("list.yaml", "- 1\n- 2\n", "expected a mapping"),
        ("bad.yaml", "a: [1\n", "not valid YAML"),
        ("bad.json", "{", "not valid JSON"),
    ],
)
def test_load_errors(tmp_path, name, text, match):
    (tmp_path / name).write_text(text)
    with pytest.raises(AgentConfigError, match=match):
        load_config_file(tmp_path / name)


def test_load_missing_file(tmp_path):
    with pytest.raises(AgentConfigError, match="cannot read config"):
        load_config_file(tmp_path / "missing.yaml")


# ---- schedules ------------------------------------------------------------------------------


def test_constant():
    assert constant(0.3)(0) == constant(0.3)(10**9) == 0.3


def test_linear_start_middle_end_and_clamp():
    schedule = linear(1.0, 0.1, 100)
    assert schedule(0) == 1.0
    assert schedule(50) == pytest.approx(0.55)
    assert schedule(100) == pytest.approx(0.1)
    assert schedule(10**6) == pytest.approx(0.1)
    assert schedule(-5) == 1.0


def test_exponential_matches_di_engine_formula():
    schedule = exponential(0.95, 0.1, 10000)
    assert schedule(0) == pytest.approx(0.95)
    assert schedule(10000) == pytest.approx(0.1 + 0.85 * math.exp(-1))
    assert schedule(10**7) == pytest.approx(0.1)
    values = [schedule(t) for t in range(0, 50000, 5000)]
    assert values == sorted(values, reverse=True)


def test_make_schedule_from_config_dicts():
    assert make_schedule(
        {"type": "linear", "start": 1.0, "end": 0.05, "duration": 10000}
    ) == LinearSchedule(1.0, 0.05, 10000)
    assert make_schedule(
        {"type": "exponential", "start": 0.95, "end": 0.1, "decay": 10000}
    ) == ExponentialSchedule(0.95, 0.1, 10000)
    assert make_schedule({"type": "constant", "value": 0.5}) == ConstantSchedule(0.5)


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"type": "cosine"}, "valid types: constant, linear, exponential"),
        ({"start": 1.0}, "unknown schedule type None"),
        ({"type": "linear", "start": 1.0, "end": 0.0}, "takes parameters start, end, duration"),
        ({"type": "constant", "value": 1, "extra": 2}, "takes parameters value"),
        ({"type": "linear", "start": 1.0, "end": 0.0, "duration": 0}, "duration must be > 0"),
        ({"type": "exponential", "start": 1.0, "end": 0.0, "decay": -1}, "decay must be > 0"),
    ],
)
def test_make_schedule_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        make_schedule(spec)


def test_schedules_pickle():
    schedule = make_schedule({"type": "linear", "start": 1.0, "end": 0.0, "duration": 10})
    assert pickle.loads(pickle.dumps(schedule))(5) == 0.5
