"""The YAML config layer: defaults, shipped configs, located errors, overrides, models, paths."""

import copy
import json
import re
from dataclasses import fields, replace
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given, strategies as st

from delegate import CompileOptions, ConfigError
from delegate import config as config_module
from delegate.config import Config, Settings, load_config
from delegate.session import run_settings
from delegate.config_schema import GLOBAL_SETTINGS, MODEL_SETTINGS, installed_schema

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def write(tmp_path: Path, text: str, name: str = "conf.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def config_error(path, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, *args, **kwargs)
    assert "\n" not in str(info.value)
    return info.value


# -- defaults and shipped files -------------------------------------------------------

def test_defaults_are_the_edge_profile():
    config = load_config()
    assert [b.name for b in config.backends] == ["opencl", "wgpu", "cpu"]
    assert (config.precision, config.partitioner, config.fallback) == ("fp16", "cost", True)
    assert config.allow_quantized
    assert (config.max_delegated_partitions, config.min_nodes_per_partition) == (3, 1)
    assert config.serialization.dir is None and config.num_threads is None
    assert config.input.range == (-1.0, 1.0) and config.cpu["engine"] == "auto"
    assert config.models == () and config.source is None
    edge = ROOT / "configs" / "edge.yaml"
    assert load_config(edge) == replace(config, source=str(edge))
    # the built-in defaults alone are not validated when loaded: they must be valid here
    config_module.validate_document(config_module._defaults())


def test_edge_yaml_is_the_packaged_default():
    packaged = resources.files("delegate").joinpath(config_module.DEFAULTS_RESOURCE).read_bytes()
    assert (ROOT / "configs" / "edge.yaml").read_bytes() == packaged


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads(path):
    config = load_config(path)
    assert config.source == str(path)
    json.dumps(config.as_dict())


def test_shipped_configs_say_what_they_promise():
    cpu = load_config(ROOT / "configs" / "cpu.yaml")
    assert [b.name for b in cpu.backends] == ["cpu"] and cpu.precision == "fp32"
    gpu = load_config(ROOT / "configs" / "gpu-fp32.yaml")
    assert [b.name for b in gpu.backends] == ["opencl", "wgpu", "cpu"] and gpu.precision == "fp32"
    assert gpu.backends[0].options == {"device_type": "gpu"}
    multi = load_config(ROOT / "configs" / "multi-model.yaml")
    assert [(m.name, m.path, m.precision) for m in multi.models] == [
        ("detector", "zoo:mobilenet_v1", "fp16"), ("keypoints", "zoo:posenet", "fp32")]


def test_schema_is_valid_and_matches_the_typed_config():
    jsonschema.Draft202012Validator.check_schema(installed_schema())
    assert {f.name for f in fields(Settings)} == set(MODEL_SETTINGS) | set(GLOBAL_SETTINGS)
    assert set(installed_schema()["properties"]) == set(MODEL_SETTINGS) | set(GLOBAL_SETTINGS) | {"models"}


def schema_keys(schema: dict, prefix: str = ""):
    for name, sub in schema.get("properties", {}).items():
        key = f"{prefix}{name}"
        yield key
        yield from schema_keys(sub, key + ".")
        if "items" in sub:
            yield from schema_keys(sub["items"], key + "[].")


def test_docs_describe_every_key():
    doc = (ROOT / "docs" / "config.md").read_text()
    documented = set(re.findall(r"`([\w.\[\]]+)`", doc))
    # a model section's own keys are documented; the rest are the top-level ones
    inherited = tuple(f"models[].{k}" for k in MODEL_SETTINGS)
    missing = [k for k in schema_keys(installed_schema()) if k not in documented and not k.startswith(inherited)]
    assert missing == []
    for options in installed_schema()["properties"]["backends"]["items"]["allOf"]:
        for option in options["then"]["properties"]["options"]["properties"]:
            assert f"`backends[].options.{option}`" in doc


def test_compile_options_and_run_settings():
    config = load_config(None, ["num_threads=3", "serialization.dir=/tmp/kernels",
                                "serialization.model_token=m1", "precision=fp32"])
    options = config.compile_options()
    assert isinstance(options, CompileOptions)
    assert (options.precision, options.allow_quantized, options.num_threads) == ("fp32", True, 3)
    assert (options.cache_dir, options.model_token) == ("/tmp/kernels", "m1")
    assert options.inference_preference == "fast_single_answer"
    assert load_config().compile_options().num_threads >= 1
    settings = run_settings(load_config(None, ["pin=[{op: SOFTMAX, backend: cpu}]"]))
    assert settings.backends == [("opencl", {}), ("wgpu", {}), ("cpu", {"engine": "auto", "native": True})]
    assert settings.placement.pins[0].op == "SOFTMAX" and settings.fallback


def test_sections_read_like_mappings_without_nulls():
    config = load_config()
    assert config.validate.max_abs_error is None and "max_abs_error" not in config.validate
    assert dict(config.validate) == {"min_cosine": 0.999}
    assert config.serialization.get("dir") is None and config.input["color"] == "RGB"


def test_empty_and_comment_only_files_mean_defaults(tmp_path):
    for text in ("", "# nothing here\n", "---\n"):
        config = load_config(write(tmp_path, text))
        assert config.precision == "fp16" and config.source == str(tmp_path / "conf.yaml")


def test_file_mappings_merge_into_defaults(tmp_path):
    config = load_config(write(tmp_path, "accuracy_guard: {enabled: true}\nbackends: [cpu]\n"))
    assert config.accuracy_guard.enabled and config.accuracy_guard.max_rel_error == 0.01
    assert [b.name for b in config.backends] == ["cpu"]


def test_anchors_and_merge_keys(tmp_path):
    text = """\
serialization: &cache {dir: /tmp/c, model_token: shared}
models:
  - &base {path: a.tflite, precision: fp32, serialization: {<<: *cache, model_token: a}}
  - {<<: *base, path: b.tflite, name: b}
"""
    config = load_config(write(tmp_path, text))
    assert [m.serialization.model_token for m in config.models] == ["a", "a"]
    assert config.models[1].precision == "fp32" and config.models[1].serialization.dir == "/tmp/c"


# -- located errors -------------------------------------------------------------------

ERRORS = [
    # (text, line, key path, fragments of the message)
    ("backends: [cpu]\nprecison: fp16\n", 2, "precison", ["unknown key 'precison'", "did you mean 'precision'?"]),
    ("accuracy_guard:\n  enabld: true\n", 2, "accuracy_guard.enabld", ["did you mean 'enabled'?"]),
    ("zzz: 1\n", 1, "zzz", ["unknown key 'zzz'", "valid keys here: backends, precision"]),
    ("num_threads: four\n", 1, "num_threads", ["expected an integer or null, got string 'four'"]),
    ("fallback: 1\n", 1, "fallback", ["expected true or false, got integer 1"]),
    ("backends: cpu\n", 1, "backends", ["expected a list, got string 'cpu'"]),
    ("num_threads: 0\n", 1, "num_threads", ["must be >= 1, got 0"]),
    ("precision: fp8\n", 1, "precision", ["'fp8' is not one of: fp32, fp16"]),
    ("cpu:\n  engine: tflite\n", 2, "cpu.engine", ["not one of: numpy, litert, auto"]),
    ("partitioner: true\n", 1, "partitioner", ["true is not one of: cost, greedy"]),
    ("backends:\n  - cpu\n  - name: opencl\n    options: {device_type: gpuu}\n", 4,
     "backends[1].options.device_type", ["'gpuu' is not one of: gpu, cpu, accelerator, any"]),
    # options each plugin declares (BackendInfo.options) are checked as closely as core's own keys
    ("backends:\n  - name: opencl\n    options:\n      devce_type: gpu\n", 4, "backends[0].options.devce_type",
     ["unknown key 'devce_type'", "did you mean 'device_type'?"]),
    ("backends:\n  - name: wgpu\n    options: {workgroup_size: 0}\n", 3, "backends[0].options.workgroup_size",
     ["must be >= 1, got 0"]),
    ("cpu:\n  engin: numpy\n", 2, "cpu.engin", ["did you mean 'engine'?"]),
    ("backends: [cpu, wgpu, cpu]\n", 1, "backends[2]", ["backend 'cpu' is listed twice"]),
    ("backends: []\n", 1, "backends", ["needs at least 1 item(s), got 0"]),
    ("pin:\n  - {op: CONV_2D, index: 3, backend: cpu}\n", 2, "pin[0]", ["exactly one of op, index or tensor"]),
    ("pin:\n  - {op: CONV_2D}\n", 2, "pin[0]", ["missing required key 'backend'"]),
    ("deny:\n  - {opp: CONV_2D}\n", 2, "deny[0].opp", ["did you mean 'op'?"]),
    ("input:\n  range: [1, 0]\n", 2, "input.range", ["lo < hi"]),
    ("input:\n  std: [1, 0]\n", 2, "input.std[1]", ["must be > 0, got 0"]),
    ("validate:\n  min_cosine: 2\n", 2, "validate.min_cosine", ["must be <= 1"]),
    ("serialization:\n  model_token: 2024-01-01\n", 2, "serialization.model_token",
     ["got date 2024-01-01", "quote it"]),
    ("serialization:\n  dir: $NO_SUCH_DELEGATE_VAR/x\n", 2, "serialization.dir",
     ["environment variable NO_SUCH_DELEGATE_VAR is not set"]),
    ("precision: fp16\nfallback: true\nprecision: fp32\n", 3, "precision",
     ["duplicate key 'precision' (first at line 1, again at line 3)"]),
    ("models:\n  - path: a.tflite\n    precision: fp8\n", 3, "models[0].precision", ["not one of: fp32, fp16"]),
    ("models:\n  - path: a.tflite\n  - name: b\n", 3, "models[1]", ["missing required key 'path'"]),
    ("models:\n  - path: a.tflite\n  - pth: b.tflite\n", 3, "models[1].pth", ["did you mean 'path'?"]),
    ("models:\n  - path: a.tflite\n    fallback: false\n", 3, "models[0].fallback", ["only be set at the top level"]),
    ("models:\n  - a.tflite\n", 2, "models[0]", ["expected a mapping, got string 'a.tflite'"]),
    ("models:\n  - {path: x/a.tflite}\n  - {path: y/a.tflite}\n", 3, "models[1].path",
     ["model name 'a' is already used by models[0]"]),
    ("models:\n  - path: a.tflite\n    name: ''\n", 3, "models[0].name", ["must not be empty"]),
    ("backends: [cpu\nprecision: fp16\n", 2, None, ["invalid YAML", "flow sequence from line 1"]),
    ("precision: fp16\n  fallback: true\n", 2, None, ["invalid YAML", "mapping values are not allowed"]),
    ("precision: 'fp16\n", 2, None, ["invalid YAML", "quoted scalar from line 1"]),
    ("precision: fp16\nbackends: [cpu]\n\tfallback: true\n", 3, None, ["invalid YAML"]),
    ("1: fp16\n", 1, None, ["key '1' must be text", "quote it"]),
    ("date: 2024-13-45\n", 1, "date", ["cannot read '2024-13-45'", "month must be in 1..12"]),
    ("precision: !!python/name:os.system x\n", 1, None, ["could not determine a constructor"]),
    ("a: &x [*x]\n", 1, "a[0]", ["alias refers to the collection that contains it"]),
    ("- cpu\n- wgpu\n", 1, None, ["top level must be a mapping of keys, not a list"]),
    ("fallback: .nan\n", 1, "fallback", ["NaN"]),
    ("precision: fp16\n---\nprecision: fp32\n", 2, None, ["single document"]),
]


@pytest.mark.parametrize("text,line,key,fragments", ERRORS, ids=[e[0][:40] for e in ERRORS])
def test_errors_name_file_key_and_line(tmp_path, text, line, key, fragments):
    path = write(tmp_path, text)
    error = config_error(path)
    assert (error.file, error.line, error.key) == (str(path), line, key)
    assert str(error).startswith(f"{path}:{line}: " + (f"{key}: " if key else ""))
    for fragment in fragments:
        assert fragment in str(error)


def test_file_problems(tmp_path, monkeypatch):
    missing = config_error(tmp_path / "nope.yaml")
    assert str(missing) == f"{tmp_path / 'nope.yaml'}: no such config file"
    assert "is a directory" in str(config_error(tmp_path))
    bad_bytes = tmp_path / "latin1.yaml"
    bad_bytes.write_bytes(b"precision: fp16\n# caf\xe9\n")
    error = config_error(bad_bytes)
    assert (error.line, error.file) == (2, str(bad_bytes)) and "not UTF-8" in str(error)
    control = write(tmp_path, "precision: fp16\nbackends: [\x07]\n", "control.yaml")
    assert config_error(control).line == 2

    def refuse(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied")

    locked = write(tmp_path, "precision: fp16\n", "locked.yaml")
    monkeypatch.setattr(config_module, "open", refuse, raising=False)
    assert str(config_error(locked)) == f"{locked}: cannot read: Permission denied"


# -- overrides ------------------------------------------------------------------------

def test_set_overrides_parse_yaml_values(tmp_path):
    path = write(tmp_path, "models:\n  - {path: a.tflite, precision: fp16}\n")
    config = load_config(path, ["precision=fp32", "serialization.dir=/tmp/x", "backends=[cpu]",
                                "models[0].precision=fp32", "num_threads=2",
                                "accuracy_guard={enabled: true}"])
    assert config.precision == "fp32" and config.serialization.dir == "/tmp/x"
    assert [b.name for b in config.backends] == ["cpu"] and config.num_threads == 2
    assert config.models[0].precision == "fp32"
    assert config.accuracy_guard.enabled and config.accuracy_guard.max_rel_error == 0.01


def test_later_overrides_win():
    assert load_config(None, ["precision=fp32", "precision=fp16"]).precision == "fp16"


SET_ERRORS = [
    ("precision=fp8", "--set precision", "precision", "'fp8' is not one of: fp32, fp16"),
    ("precison=fp16", "--set precison", "precison", "did you mean 'precision'?"),
    ("num_threads=0", "--set num_threads", "num_threads", "must be >= 1"),
    ("accuracy_guard={enabld: true}", "--set accuracy_guard", "accuracy_guard.enabld", "did you mean 'enabled'?"),
    ("input={mean: 1, mean: 2}", "--set input", "input.mean", "duplicate key 'mean'"),
    ("backends=[cpu", "--set backends", None, "invalid YAML"),
    ("models[0].precision=fp32", "--set models[0].precision", "models", "has no item [0] (it has 0)"),
    ("backends.cpu=x", "--set backends.cpu", "backends", "is a list; index it like [0]"),
    ("precision.bits=16", "--set precision.bits", "precision", "is string 'fp16', which has no bits"),
    ("precision", "--set precision", None, "has no '='"),
    ("models[x]=1", "--set models[x]", None, "expected KEY=VALUE"),
    ("=fp16", "--set", None, "expected KEY=VALUE"),
]


@pytest.mark.parametrize("override,source,key,fragment", SET_ERRORS, ids=[e[0] for e in SET_ERRORS])
def test_set_errors_name_the_override(override, source, key, fragment):
    error = config_error(None, [override])
    assert (error.file, error.key, error.line) == (source, key, None)
    assert str(error).startswith(source + ": ") and fragment in str(error)


def test_set_error_inside_a_file_value_points_at_the_file(tmp_path):
    path = write(tmp_path, "accuracy_guard:\n  enabled: true\n  max_abs_error: -1\n")
    error = config_error(path, ["accuracy_guard={max_rel_error: 0.5}"])
    assert (error.file, error.line, error.key) == (str(path), 3, "accuracy_guard.max_abs_error")


def test_backends_override_sets_priority_everywhere_and_keeps_options(tmp_path):
    path = write(tmp_path, """\
backends:
  - cpu
  - {name: opencl, options: {device_type: gpu}}
models:
  - {path: a.tflite, backends: [wgpu]}
""")
    config = load_config(path, backends="opencl, cpu")
    assert [(b.name, dict(b.options)) for b in config.backends] == [("opencl", {"device_type": "gpu"}), ("cpu", {})]
    assert [b.name for b in config.for_model(0).backends] == ["opencl", "cpu"]


def test_backends_override_errors(tmp_path):
    assert str(config_error(None, backends=" , ")).startswith("--backends: needs at least one backend")
    twice = config_error(None, backends="cpu,cpu")
    assert (twice.file, twice.key) == ("--backends", "backends[1]") and "listed twice" in str(twice)
    path = write(tmp_path, "backends:\n  - {name: opencl, options: {device_type: gpuu}}\n")
    moved = config_error(path, backends="wgpu,opencl")
    assert (moved.file, moved.line, moved.key) == (str(path), 2, "backends[1].options.device_type")


# -- models and paths -----------------------------------------------------------------

MODELS = """\
backends: [opencl, cpu]
precision: fp16
num_threads: 2
serialization: {dir: cache, model_token: top}
pin: [{op: SOFTMAX, backend: cpu}]
models:
  - path: models/det.tflite
  - name: pose
    path: zoo:posenet
    precision: fp32
    backends: [cpu]
    serialization: {model_token: pose}
    pin: []
"""


def test_model_sections_inherit_and_override(tmp_path):
    config = load_config(write(tmp_path, MODELS))
    det, pose = config.models
    assert (det.name, det.precision, det.num_threads) == ("det", "fp16", 2)
    assert [b.name for b in det.backends] == ["opencl", "cpu"] and det.pin[0].op == "SOFTMAX"
    assert (pose.name, pose.path, pose.precision) == ("pose", "zoo:posenet", "fp32")
    assert [b.name for b in pose.backends] == ["cpu"] and pose.pin == ()
    assert pose.serialization.model_token == "pose"
    assert pose.serialization.dir == det.serialization.dir == str(tmp_path / "cache")
    assert pose.fallback == config.fallback and pose.validate == config.validate
    assert pose.compile_options().precision == "fp32" and run_settings(pose).backends == [("cpu", {"engine": "auto", "native": True})]


def test_for_model_by_index_name_path_or_other(tmp_path, monkeypatch):
    config = load_config(write(tmp_path, MODELS))
    assert config.for_model(1) is config.for_model("pose") is config.for_model("zoo:posenet")
    monkeypatch.chdir(tmp_path)
    assert config.for_model("models/det.tflite") is config.models[0]
    other = config.for_model("elsewhere/net.tflite")
    assert (other.name, other.path, other.precision) == ("net", "elsewhere/net.tflite", "fp16")
    error = config_error_of(lambda: config.for_model(5))
    assert (error.key, error.file) == ("models[5]", str(tmp_path / "conf.yaml"))


def config_error_of(call) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        call()
    return info.value


def test_relative_paths_resolve_against_the_config_file(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    path = write(tmp_path / "conf", MODELS)
    monkeypatch.chdir(ROOT)
    config = load_config(path)
    assert config.models[0].path == str(tmp_path / "conf" / "models" / "det.tflite")
    assert config.serialization.dir == str(tmp_path / "conf" / "cache")
    from_cli = load_config(path, ["serialization.dir=here", "models[0].path=m.tflite"])
    assert from_cli.serialization.dir == str(ROOT / "here")
    assert from_cli.models[0].path == str(ROOT / "m.tflite")


def test_paths_expand_home_and_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DELEGATE_TEST_CACHE", "kernels")
    config = load_config(write(tmp_path, "serialization: {dir: ~/$DELEGATE_TEST_CACHE}\n"
                                         "models: [{path: ~/m.tflite}]\n"))
    assert config.serialization.dir == str(tmp_path / "kernels")
    assert config.models[0].path == str(tmp_path / "m.tflite")


def test_as_dict_is_json_ready(tmp_path):
    config = load_config(write(tmp_path, MODELS))
    doc = json.loads(json.dumps(config.as_dict()))
    assert doc["models"][1]["name"] == "pose" and doc["source"] == str(tmp_path / "conf.yaml")
    assert doc["pin"] == [{"backend": "cpu", "op": "SOFTMAX", "index": None, "tensor": None}]


# -- fuzz: whatever the text, a Config or a located ConfigError -----------------------

EDGE_TEXT = (ROOT / "configs" / "edge.yaml").read_text()
MULTI_TEXT = (ROOT / "configs" / "multi-model.yaml").read_text()
KEYS = sorted(installed_schema()["properties"]) + ["enabled", "dir", "path", "name", "options", "op", "backend"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**20), st.floats(allow_nan=True),
                    st.sampled_from(["fp16", "cpu", "zoo:x", "2024-13-01", "~/x", "$X", "[", "{a: 1}"]),
                    st.text(max_size=12))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)


def mutate_text(text: str, data) -> str:
    lines = text.splitlines(keepends=True)
    kind = data.draw(st.sampled_from(["truncate", "insert", "replace-line", "replace-char"]))
    if kind == "truncate":
        return text[:data.draw(st.integers(0, len(text)))]
    at = data.draw(st.integers(0, len(lines)))
    if kind == "replace-char":
        pos = data.draw(st.integers(0, len(text)))
        return text[:pos] + data.draw(st.text(min_size=1, max_size=3)) + text[pos + 1:]
    indent = data.draw(st.sampled_from(["", "  ", "    ", "\t"]))
    key = data.draw(st.sampled_from(KEYS) | st.text(max_size=8))
    value = data.draw(st.sampled_from(["fp16", "[cpu", "{a: 1}", "- x", "&a [*a]", "1", "", "!!int x"])
                      | st.text(max_size=10))
    new = f"{indent}{key}: {value}\n"
    return "".join(lines[:at] + [new] + lines[at + (kind == "replace-line"):])


def loads_or_locates(path: Path, overrides=()) -> None:
    """The property every fuzz test checks: a Config, or a one-line error naming its source."""
    try:
        assert isinstance(load_config(path, overrides), Config)
    except ConfigError as error:
        assert "\n" not in str(error) and str(error).startswith(f"{error.file}")
        assert error.file == str(path) or overrides and error.file.startswith("--set")


@given(st.data(), st.sampled_from([EDGE_TEXT, MULTI_TEXT]))
def test_fuzz_text_mutations(tmp_path_factory, data, text):
    path = tmp_path_factory.mktemp("fuzz") / "conf.yaml"
    path.write_text(mutate_text(text, data), encoding="utf-8")
    loads_or_locates(path)


def mutate_data(doc, data):
    """Replace one random value of a parsed config with a random one."""
    if not isinstance(doc, (dict, list)) or not doc or data.draw(st.integers(0, 3)) == 0:
        return data.draw(VALUES)
    keys = list(doc) if isinstance(doc, dict) else list(range(len(doc)))
    key = data.draw(st.sampled_from(keys))
    doc[key] = mutate_data(doc[key], data)
    return doc


@given(st.data())
def test_fuzz_structure_mutations(tmp_path_factory, data):
    doc = mutate_data(yaml.safe_load(MULTI_TEXT), data)
    path = tmp_path_factory.mktemp("fuzz") / "conf.yaml"
    path.write_text(yaml.safe_dump(doc) if isinstance(doc, dict) else json.dumps(doc), encoding="utf-8")
    loads_or_locates(path)


@given(st.sampled_from(KEYS + ["models[0].precision", "backends[1]", "input.mean", "a..b"]),
       st.sampled_from(["", "fp16", "[cpu]", "{enabled: true}", "[", "0", "null", "zoo:x"]) | st.text(max_size=10))
def test_fuzz_overrides(key, value):
    loads_or_locates(ROOT / "configs" / "multi-model.yaml", [f"{key}={value}"])


def _set_cases():
    """Every key reachable through sections of optional keys, each with values of every kind around its
    type, enum and bounds."""
    def walk(schema, prefix):
        for name, sub in schema.get("properties", {}).items():
            key = f"{prefix}{name}"
            yield key, sub
            yield from walk(sub, key + ".")
    probes = ["true", "null", "0", "-1", "1", "2.5", "x", "''", "[1]", "{a: 1}"]
    for key, sub in walk(installed_schema(), ""):
        values = list(probes) + [json.dumps(v) for v in sub.get("enum", [])]
        for bound in ("minimum", "maximum", "exclusiveMinimum"):
            if bound in sub:
                values += [json.dumps(sub[bound] + d) for d in (-1, -0.5, 0, 0.5, 1)]
        for value in values:
            yield f"{key}={value}"
    yield "unknown_key=1"
    yield "models[0].precision=fp16"


def _fresh_defaults():
    defaults = config_module._defaults()
    return config_module.Document(copy.deepcopy(defaults.data), dict(defaults.places))


def test_plainly_valid_set_values_are_valid_by_the_schema():
    """A run whose ``--set`` values are plainly valid skips jsonschema; each one it lets through must pass the
    schema, and the common settings must take that path."""
    passed = 0
    for override in _set_cases():
        doc = _fresh_defaults()
        try:
            path, value = config_module.apply_set(doc, override)
        except ConfigError:
            continue
        if config_module.plainly_valid(path, value):
            passed += 1
            assert config_module.validator().is_valid(doc.data), override
    assert passed > 50
    for override in ("num_threads=2", "cpu.engine=numpy", "precision=fp16", "inference_preference=sustained_speed"):
        doc = _fresh_defaults()
        assert config_module.plainly_valid(*config_module.apply_set(doc, override)), override
    for override in ("num_threads=-1", "num_threads=true", "precision=fp33", "unknown_key=1", "backends=[cpu]"):
        doc = _fresh_defaults()
        assert not config_module.plainly_valid(*config_module.apply_set(doc, override)), override
