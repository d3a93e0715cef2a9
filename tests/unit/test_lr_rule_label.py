"""lr_scaling=linear_constant was recorded as lr_rule "linear", like lr_scaling=linear (cosine decay):
the table's --where, the W&B tags and the batch x LR chart could not tell the two apart."""
from hydra import compose, initialize_config_dir

from scalelab.paths import conf_dir
from scalelab.results.record import lr_rule_label


def test_each_lr_scaling_config_has_its_own_label():
    labels = {}
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for name in ("none", "linear", "linear_constant", "sqrt"):
            labels[name] = lr_rule_label(compose("train", overrides=[f"lr_scaling={name}"]).lr_scaling)
    # each shipped config's label is its own name
    assert labels == {"none": "none", "linear": "linear", "linear_constant": "linear_constant", "sqrt": "sqrt"}


def test_a_decay_other_than_the_rule_s_usual_one_is_named():
    assert lr_rule_label({"rule": "sqrt", "decay": "constant"}) == "sqrt_constant"
    assert lr_rule_label({"rule": "none", "decay": "cosine"}) == "none_cosine"
    assert lr_rule_label({"rule": "linear"}) == "linear"          # an older record's config: no decay key


def test_the_table_shows_the_rule_where_runs_differ_in_it():
    from scalelab.results.table import render

    def rec(job, rule):
        return {"status": "completed", "strategy": "ddp", "world_size": 2, "global_batch_size": 32,
                "per_device_batch_size": 16, "accumulate_grad_batches": 1, "lr_rule": rule, "lr": 0.006,
                "job": {"name": job}, "throughput": {"samples_per_s": 100.0}}

    two = render([rec("s/0", "linear"), rec("s/1", "linear_constant")])
    assert "lr rule" in two.splitlines()[0]
    assert any("linear_constant" in line for line in two.splitlines()[2:])
    assert "lr rule" not in render([rec("s/0", "linear"), rec("s/1", "linear")]).splitlines()[0]
