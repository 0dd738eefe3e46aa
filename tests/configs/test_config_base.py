"""The config machinery: strict YAML loading, type coercion, overrides, atomic save."""

import dataclasses

import pytest

from ce_retrieval.configs import ConfigError, from_dict, load_yaml, merge, parse_override, save_yaml, to_dict


@dataclasses.dataclass
class Inner:
    size: int = 3
    rate: float = 0.5
    names: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Outer:
    name: str = "x"
    flag: bool = False
    path: str | None = None
    inner: Inner = dataclasses.field(default_factory=Inner)
    kwargs: dict = dataclasses.field(default_factory=dict)


def test_from_dict_coerces_and_nests():
    cfg = from_dict(Outer, {"inner": {"size": 4, "rate": 1, "names": ["a"]}, "path": None})
    assert cfg.inner == Inner(4, 1.0, ["a"]) and isinstance(cfg.inner.rate, float)


def test_unknown_key_names_full_path():
    with pytest.raises(ConfigError, match=r"unknown config key inner\.sise"):
        from_dict(Outer, {"inner": {"sise": 4}})


def test_wrong_type_names_key():
    with pytest.raises(ConfigError, match=r"inner\.size: expected an integer"):
        from_dict(Outer, {"inner": {"size": "big"}})
    with pytest.raises(ConfigError, match="flag: expected true/false"):
        from_dict(Outer, {"flag": "yes"})


def test_override_syntaxes():
    assert parse_override("inner.size=7,name=abc,inner.names=[a,b]") == {
        "inner": {"size": 7, "names": ["a", "b"]},
        "name": "abc",
    }
    assert parse_override("{inner: {rate: 0.1}}") == {"inner": {"rate": 0.1}}
    cfg = merge(Outer(), parse_override("inner.size=7,kwargs.scale=10.0"))
    assert cfg.inner.size == 7 and cfg.kwargs == {"scale": 10.0}
    with pytest.raises(ConfigError, match="unknown config key inner.nope"):
        merge(Outer(), {"inner": {"nope": 1}})
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("oops")


def test_yaml_round_trip(tmp_path):
    cfg = Outer(name="r", inner=Inner(names=["p"]), kwargs={"a": 1})
    path = tmp_path / "c.yaml"
    save_yaml(cfg, str(path))
    assert load_yaml(Outer, str(path)) == cfg
    assert load_yaml(Outer, str(path), ["inner.size=9"]).inner.size == 9
    assert to_dict(cfg)["inner"]["names"] == ["p"]
    (tmp_path / "bad.yaml").write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_yaml(Outer, str(tmp_path / "bad.yaml"))


def test_config_constructors_build_nested_mappings_with_from_dict():
    # DataConfig / ModelConfig accept nested mappings (``dataclasses.asdict`` output, an export's metadata); they
    # used to splat them (``SplitPaths(**d)``: a TypeError without the key path, no type checks). The rule is the
    # one config-from-dict's: unknown keys and wrong types are ConfigErrors naming the key path.
    from ce_retrieval.data.config import DataConfig, SplitPaths
    from ce_retrieval.modeling.config import ModelConfig

    assert DataConfig(tsv_path={"train": "/t.tsv"}).tsv_path == SplitPaths(train="/t.tsv")
    with pytest.raises(ConfigError, match="tsv_path.trian"):
        DataConfig(tsv_path={"trian": "/t.tsv"})
    with pytest.raises(ConfigError, match="text.max_seq_length: expected an integer"):
        ModelConfig(text={"max_seq_length": "long"})
    hue = ModelConfig(image={"augmentation": {"hue": 0}}).image.augmentation.hue
    assert hue == 0.0 and isinstance(hue, float)  # coerced to the declared type
