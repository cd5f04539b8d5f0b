"""The job spec: every validation rule names its field and rule; presets; strategy labels."""

import pytest

from jobs.spec import (
    PRESETS,
    SpecError,
    derive_strategy,
    field_docs,
    parse_spec,
    presets_table,
    resolve_preset,
)


def errors_of(data, **kw):
    with pytest.raises(SpecError) as ei:
        parse_spec(data, **kw)
    return ei.value.errors


def has(errors, loc, fragment):
    return any(e["loc"] == loc and fragment in e["msg"] for e in errors)


RULES = [
    ("degrees vs world size", {"parallel": {"dp": 2}, "runtime": {"nproc_per_node": 4}},
     ["parallel"], "must equal nnodes*nproc_per_node = 4"),
    ("tp divides heads", {"model": {"arch": "gpt", "heads": 3, "hidden": 12},
                          "parallel": {"tp": 2}, "runtime": {"nproc_per_node": 2}},
     ["parallel", "tp"], "must divide model.heads = 3"),
    ("tp divides hidden", {"model": {"hidden": 63}, "parallel": {"tp": 2},
                           "runtime": {"nproc_per_node": 2}},
     ["parallel", "tp"], "must divide model.hidden = 63"),
    ("layers vs pp*v", {"model": {"layers": 3}, "parallel": {"pp": 2},
                        "runtime": {"nproc_per_node": 2}},
     ["model", "layers"], "divisible by pp*virtual_stages = 2"),
    ("layers vs interleaved chunks", {"model": {"layers": 6}, "parallel": {
        "pp": 2, "virtual_stages": 2, "pp_schedule": "interleaved", "microbatches": 2},
        "runtime": {"nproc_per_node": 2}, "train": {"global_batch": 8}},
     ["model", "layers"], "pp*virtual_stages = 4"),
    ("global batch", {"parallel": {"dp": 2, "microbatches": 2}, "train": {"global_batch": 6}},
     ["train", "global_batch"], "dp*microbatches*grad_accum = 4"),
    ("global batch with accumulation", {"parallel": {"dp": 2}, "train": {
        "global_batch": 8, "grad_accum": 3}},
     ["train", "global_batch"], "dp*microbatches*grad_accum = 6"),
    ("world size cap", {"parallel": {"dp": 16}, "runtime": {"nproc_per_node": 16}},
     ["runtime", "nproc_per_node"], "exceeds the configured cap of 8"),
    ("multi-host world size cap", {"parallel": {"dp": 16},
                                   "runtime": {"nnodes": 4, "nproc_per_node": 4}},
     ["runtime", "nproc_per_node"], "nnodes*nproc_per_node = 16 exceeds the configured cap"),
    ("unknown field", {"parallel": {"dp": 2, "bogus": 1}},
     ["parallel", "bogus"], "unknown field"),
    ("unknown top-level field", {"parallelism": {}}, ["parallelism"], "unknown field"),
    ("integer type", {"train": {"steps": "five"}}, ["train", "steps"], "must be an integer"),
    ("bool is not an integer", {"train": {"steps": True}}, ["train", "steps"],
     "must be an integer"),
    ("enum", {"parallel": {"dp_mode": "magic"}}, ["parallel", "dp_mode"],
     "must be one of ps, allreduce, ddp"),
    ("range", {"parallel": {"zero_stage": 4}}, ["parallel", "zero_stage"], "must be <= 3"),
    ("section type", {"train": [1, 2]}, ["train"], "must be an object"),
    ("sequence parallel needs tp", {"parallel": {"sequence_parallel": True, "dp": 2}},
     ["parallel", "sequence_parallel"], "needs parallel.tp > 1"),
    ("virtual stages need interleaved", {"parallel": {"pp": 2, "virtual_stages": 2},
                                         "model": {"layers": 4}},
     ["parallel", "virtual_stages"], "unless pp_schedule is 'interleaved'"),
    ("zbv needs two virtual stages", {"parallel": {"pp": 2, "pp_schedule": "zbv"},
                                      "model": {"layers": 4}},
     ["parallel", "virtual_stages"],
     "parallel.virtual_stages = 1 must be 2 with pp_schedule 'zbv'"),
    ("zbv takes no more than two", {"parallel": {"pp": 2, "pp_schedule": "zbv",
                                                 "virtual_stages": 4}, "model": {"layers": 8}},
     ["parallel", "virtual_stages"], "must be 2 with pp_schedule 'zbv'"),
    ("layers vs zbv chunks", {"model": {"layers": 6}, "parallel": {
        "pp": 2, "virtual_stages": 2, "pp_schedule": "zbv", "microbatches": 2},
        "runtime": {"nproc_per_node": 2}, "train": {"global_batch": 8}},
     ["model", "layers"], "pp*virtual_stages = 4"),
    ("virtual stages need a pipeline", {"model": {"arch": "gpt"}, "parallel": {
        "tp": 2, "pp_schedule": "interleaved", "virtual_stages": 2}},
     ["parallel", "virtual_stages"], "virtual_stages = 2 needs parallel.pp > 1"),
    ("measured partition needs a layer per stage", {"model": {"layers": 3}, "parallel": {
        "pp": 2, "virtual_stages": 2, "pp_schedule": "interleaved", "pp_partition": "measured",
        "microbatches": 2}, "train": {"global_batch": 8}},
     ["model", "layers"], "must be at least pp*virtual_stages = 4"),
    ("partition choices", {"parallel": {"pp_partition": "random"}},
     ["parallel", "pp_partition"], "must be one of"),
    ("ZeRO with a parameter server", {"parallel": {"dp": 2, "dp_mode": "ps", "zero_stage": 1}},
     ["parallel", "zero_stage"], "cannot be combined with dp_mode 'ps'"),
    ("fp32 grads only with bf16", {"train": {"fp32_grads": True}}, ["train", "fp32_grads"],
     "only applies to precision 'bf16'"),
    ("queue name", {"runtime": {"queue": "a b;rm"}}, ["runtime", "queue"], "must match"),
    ("empty name", {"name": "  "}, ["name"], "1 to 200 characters"),
    ("tensor parallelism needs a transformer", {"parallel": {"tp": 2}},
     ["model", "arch"], "tensor parallelism needs arch 'gpt'"),
    ("vocab parallel needs tp", {"model": {"arch": "gpt"}, "parallel": {
        "dp": 2, "vocab_parallel": True}}, ["parallel", "vocab_parallel"], "needs parallel.tp > 1"),
    ("model parallelism is fp32", {"parallel": {"pp": 2}, "train": {"precision": "bf16"}},
     ["train", "precision"], "runs in fp32 only"),
    ("optimizer choices", {"train": {"optimizer": "lamb"}}, ["train", "optimizer"],
     "must be one of adam, sgd"),
    ("reference ZeRO-3 is DP only", {"model": {"arch": "gpt"}, "parallel": {
        "dp": 2, "tp": 2, "zero_stage": 3}, "runtime": {"nproc_per_node": 4}},
     ["parallel", "zero_stage"], "use engine 'native' (FSDP2)"),
    ("reference ZeRO-2 with pipelines", {"parallel": {"dp": 2, "pp": 2, "zero_stage": 2},
                                         "runtime": {"nproc_per_node": 4}},
     ["parallel", "zero_stage"], "reduce-scatter per micro-batch"),
    ("native parameter server", {"parallel": {"dp": 2, "dp_mode": "ps", "engine": "native"}},
     ["parallel", "engine"], "no native PyTorch component"),
    ("native bf16 needs FSDP2", {"parallel": {"dp": 2, "engine": "native"},
                                 "train": {"precision": "bf16"}},
     ["train", "precision"], "needs FSDP2"),
]


@pytest.mark.parametrize("data,loc,fragment", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_each_rule_names_field_and_rule(data, loc, fragment):
    data = {"parallel": {"dp": 2}, **data} if "parallel" not in data else data
    errors = errors_of(data)
    assert has(errors, loc, fragment), errors


def test_valid_default_spec_and_labels():
    spec = parse_spec({"parallel": {"dp": 2}})
    assert spec.world_size == 2 and spec.strategy == "ddp" and spec.version == 1
    assert spec.to_dict()["parallel"]["dp"] == 2


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_a_valid_spec_with_its_own_label(name):
    spec = parse_spec({"preset": name})
    expected = {"fsdp": "fsdp", "collective-sweep": "collective-sweep", "moe": "ddp+moe",
                "moe-ep": "ddp+moe-ep", "4d-moe": "3d+moe-ep",
                "cp-3d": "tp+pp-1f1b+cp"}.get(name, name)
    assert derive_strategy(spec) == expected


def test_checkpointing_composes_with_model_parallelism():
    """Activation checkpointing is no longer refused with tp / pp / 3D (issue 12)."""
    for par, n in (({"pp": 2}, 2), ({"tp": 2}, 2), ({"dp": 2, "tp": 2, "pp": 2}, 8)):
        spec = parse_spec({"model": {"arch": "gpt"}, "parallel": par,
                           "train": {"activation_checkpointing": True},
                           "runtime": {"nproc_per_node": n}}, max_world_size=8)
        assert spec.train.activation_checkpointing


def test_optimizer_defaults_to_adam():
    assert parse_spec({"parallel": {"dp": 2}}).train.optimizer == "adam"
    assert parse_spec({"parallel": {"dp": 2}, "train": {"optimizer": "sgd"}}).train.optimizer \
        == "sgd"


def test_preset_overrides_merge_nested_fields():
    data = resolve_preset({"preset": "zero2", "parallel": {"dp": 4},
                           "runtime": {"nproc_per_node": 4}, "name": "mine"})
    spec = parse_spec(data)
    assert spec.parallel.zero_stage == 2 and spec.parallel.dp == 4 and spec.name == "mine"


def test_unknown_preset():
    assert has(errors_of({"preset": "zero9"}), ["preset"], "unknown preset 'zero9'")


def test_unavailable_strategy_refused_with_reason(monkeypatch):
    import jobs.spec as specmod
    monkeypatch.setattr(specmod, "AVAILABLE", {"ddp"})
    errors = errors_of({"preset": "zero3"}, require_available=True)
    assert has(errors, ["parallel"], "strategy 'zero3' is not available yet")
    parse_spec({"preset": "ddp"}, require_available=True)


def test_combined_labels():
    assert parse_spec({"parallel": {"dp": 2, "tp": 2}, "runtime": {"nproc_per_node": 4},
                       "model": {"arch": "gpt"}}).strategy == "ddp+tp"
    assert parse_spec({"parallel": {"pp": 2, "pp_schedule": "gpipe"}}).strategy == "pp-gpipe"
    assert parse_spec({"runtime": {"nproc_per_node": 1}}).strategy == "single"


def test_presets_table_documents_native_component():
    rows = presets_table()
    assert {r["name"] for r in rows} == set(PRESETS)
    assert all(r["native"] and r["title"] and "available" in r for r in rows)
    docs = field_docs()
    assert docs["parallel.zero_stage"]["le"] == 3 and "doc" in docs["train.lr"]


def test_json_schema_accepts_specs_and_presets_and_rejects_unknown_fields():
    import jsonschema

    from jobs.spec import json_schema
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for name in PRESETS:
        jsonschema.validate(parse_spec({"preset": name}).to_dict(), schema)
    jsonschema.validate({"preset": "zero2", "parallel": {"dp": 4}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"parallel": {"dp": 2, "bogus": 1}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"parallel": {"zero_stage": 7}}, schema)


def test_zbv_preset_and_label():
    spec = parse_spec({"preset": "pp-zbv"})
    p = spec.parallel
    assert (p.pp, p.pp_schedule, p.virtual_stages) == (2, "zbv", 2)
    assert spec.strategy == "pp-zbv"
    assert PRESETS["pp-zbv"].native == "torch.distributed.pipelining.ScheduleZBVZeroBubble"
    assert "zbv" in field_docs()["parallel.pp_schedule"]["choices"]
    parse_spec({"preset": "pp-zbv"}, require_available=True)
