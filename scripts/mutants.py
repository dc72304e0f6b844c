"""`make mutants`: does each guarantee's test fail when its mechanic is removed?

Each mutant below deletes or perturbs one line of an engine mechanic. For each, the repository is copied to a
scratch directory, the mutant applied there (never in your checkout), and the tests that guard the mechanic run
against the copy (subprocesses too: the suite imports the checkout it runs from). A mutant the tests still pass
on is a *survivor*: a guarantee that nothing proves. Those tests first run once unmutated (a test that fails
anyway would "kill" every mutant). Exit status 1 if any mutant survived.

    python scripts/mutants.py              # every mutant against its own tests (a few minutes)
    python scripts/mutants.py --only warmup tail-window
    python scripts/mutants.py --whole-suite   # does any test of the whole suite notice? (its own tests first)
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Mutant(NamedTuple):
    name: str
    file: str
    original: str  # must occur exactly once in the file
    mutated: str
    tests: tuple[str, ...]


TOKENS_ACCUMULATION = (
    "tests/test_tokens.py::test_accumulated_variable_length_micro_batches_equal_the_big_batch_and_the_closed_form"
)
PORTABLE_RUN = "tests/test_contract.py::test_a_copied_run_predicts_and_exports_without_its_training_data"
CONFIGURED_MONITOR = (
    "tests/test_classification.py::test_the_metric_named_in_the_config_picks_the_best_checkpoint_and_the_sweeps_metric"
)
ID_COLUMNS = "tests/test_table.py::test_the_prediction_file_carries_the_id_columns_as_written_in_input_order"
TEST_SPLIT_IDS = "tests/test_table.py::test_predictions_on_the_test_split_carry_its_rows_id_columns"
NOTEBOOK_ON_A_COPY = (
    "tests/test_contract.py::test_the_inspect_notebook_scores_a_copied_run_on_the_test_inputs_its_checkpoint_keeps"
)
NEW_REPOSITORY = (
    "tests/test_new_project.py::test_the_new_repository_is_the_template_renamed_with_only_the_kept_examples"
)
NEW_REPOSITORY_TESTS = "tests/test_new_project.py::test_the_new_repositorys_tests_pass_in_it"
BAD_NEW_PROJECT = "tests/test_new_project.py::test_bad_input_is_refused_in_one_sentence_writing_nothing"
REFUSED_NEW_PROJECT = "tests/test_new_project.py::test_a_destination_holding_files_or_a_left_out_default_is_refused"
ENGINE_UPDATE = "tests/test_update_engine.py::test_a_newer_template_merges_into_the_repository_three_ways"
SHIPPED = (
    Mutant("warmup-is-linear", "project/recipe.py",
           "lrs.append(base_lr * (self.last_epoch + 1) / self.warmup_steps)", "lrs.append(base_lr)",
           ("tests/test_schedule.py",)),
    Mutant("cosine-decay", "project/recipe.py",
           "0.5 * (1.0 + math.cos(math.pi * self.progress(step)))", "(1.0 - self.progress(step))",
           ("tests/test_schedule.py",)),
    Mutant("wsd-decays-over-the-last-fraction", "project/recipe.py",
           "self.total_steps - 1 - math.ceil(self.decay_fraction", "self.total_steps - math.ceil(self.decay_fraction",
           ("tests/test_schedule.py",)),
    Mutant("each-group-at-its-lr-scale", "project/recipe.py",
           'group["lr"] = built.defaults["lr"] * group["lr_scale"]', 'group["lr"] = built.defaults["lr"]',
           ("tests/test_schedule.py",)),
    Mutant("evaluation-outputs-reach-callbacks", "project/engine/task.py",
           '        return {"outputs": outputs, "targets": y}', '        return {"outputs": outputs[:0], "targets": y}',
           ("tests/test_mechanics.py::test_each_evaluation_batchs_outputs_and_targets_reach_the_callbacks",)),
    Mutant('a-left-out-guarantee-is-said', 'project/engine/checks.py',
           'rank_zero_info(f"The config\'s {key} leaves out {name}: {lost} (configs/default.yaml lists it).")',
           'pass',
           ("tests/test_config.py::test_what_runs_is_what_the_config_lists",)),
    Mutant("the-optimizer-is-the-configs", "project/engine/task.py",
           "optimizer = recipe.build_optimizer(self.optimizer,",
           "optimizer = recipe.build_optimizer(torch.optim.AdamW,",
           ("tests/test_mechanics.py::test_the_optimizer_and_schedule_are_the_configs",)),
    Mutant("longer-resume-replans-the-schedule", "project/recipe.py",
           "            self.warmup_steps, self.total_steps = planned", "            pass",
           ("tests/test_resume.py::test_a_run_resumed_to_train_longer_follows_the_schedule_of_its_new_length",)),
    Mutant("accumulation-tail-window", "project/engine/accumulation.py",
           "    return k / window",
           "    return 1.0",
           ("tests/test_mechanics.py::test_accumulation_equals_the_large_batch_including_the_partial_last_window",)),
    Mutant("weight-decay-on-matrices-only", "project/recipe.py",
           '"lr_scale": scale, "weight_decay": 0.0}', '"lr_scale": scale, "weight_decay": 1e-4}',
           ("tests/test_mechanics.py::test_weight_decay_applies_to_weight_matrices_and_kernels_only",)),
    Mutant("grad-norm-before-clipping", "project/engine/monitor.py",
           "get_total_norm([p.grad for p in pl_module.parameters() if p.grad is not None])",
           "get_total_norm([p.grad for p in pl_module.parameters() if p.grad is not None]).clamp(max=1.0)",
           ("tests/test_mechanics.py::test_grad_norm_is_logged_on_logging_steps_only_with_the_true_value",)),
    Mutant('rng-state-restored-on-resume', 'project/engine/task.py',
           '            rng.restore_rng_state(checkpoint["rng_states"])',
           '            pass',
           ("tests/test_resume.py::test_resumed_run_equals_the_uninterrupted_one[epoch-boundary]",)),
    Mutant("python-rng-restored", "project/engine/rng.py",
           "    random.setstate((version, tuple(internal), gauss))", "    pass",
           ("tests/test_resume.py::test_resumed_run_equals_the_uninterrupted_one[mid-epoch-numpy-python-rng]",)),
    Mutant("numpy-rng-restored", "project/engine/rng.py", "    np.random.set_state(", "    (lambda state: None)(",
           ("tests/test_resume.py::test_resumed_run_equals_the_uninterrupted_one[mid-epoch-numpy-python-rng]",)),
    Mutant("float64-weights-restored-whole", "project/engine/task.py",
           "            self.trainer.precision_plugin.convert_module(self)", "            pass",
           ("tests/test_resume.py::test_resumed_run_equals_the_uninterrupted_one[sigint-float64]",)),
    Mutant("eval-loss-is-a-per-sample-mean", "project/engine/metrics.py",
           "        metric.update(losses)\n",
           "        metric.update(losses.mean())\n",
           ("tests/test_train.py::test_default_config_learns_and_writes_a_complete_run",)),
    Mutant("eval-sampler-unpadded", "project/engine/samplers.py",
           "return iter(range(self.rank, len(self.dataset), self.num_replicas))",
           "return super().__iter__()",
           ("tests/test_data.py::test_unpadded_eval_sampler_sees_every_sample_exactly_once",)),
    Mutant("mid-epoch-resume-skips-consumed-batches", "project/engine/samplers.py",
           "return itertools.islice(super().__iter__(), skip, None)", "return super().__iter__()",
           ("tests/test_resume.py::test_resumed_run_equals_the_uninterrupted_one[mid-epoch]",)),
    Mutant("every-rank-stops-at-the-same-step", "project/engine/last_checkpoint.py",
           'signalled, worker_died = (bool(f) for f in trainer.strategy.reduce(flags, reduce_op="sum").tolist())',
           "pass",
           ("tests/test_ddp.py::test_the_slurm_script_trains_one_ddp_run_that_a_sigterm_requeues_and_the_requeue_finishes",)),
    Mutant("dead-loader-worker-stops-at-a-step-boundary", "project/engine/last_checkpoint.py",
           "self._previous_handlers[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self._child_exited)", "pass",
           ("tests/test_crash_safety.py::test_a_killed_loader_worker_stops_the_run_at_a_step_boundary_with_a_checkpoint_and_it_resumes_exactly",)),
    Mutant("checkpoint-written-atomically", "project/engine/checkpoints.py",
           'tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")', "tmp = path",
           ("tests/test_crash_safety.py::test_atomic_save_replaces_in_the_same_directory_and_never_truncates",)),
    Mutant("checkpoints-load-weights-only", "project/engine/checkpoints.py",
           'checkpoint = torch.load(path, map_location="cpu", weights_only=True)',
           'checkpoint = torch.load(path, map_location="cpu", weights_only=False)',
           ("tests/test_crash_safety.py::test_a_checkpoint_carrying_code_is_refused_and_the_code_never_runs",)),
    Mutant("provenance-never-copies-secrets", "project/engine/git_snapshot.py",
           "if any(fnmatch.fnmatch(path.name.lower(), pattern) for pattern in SECRET_NAMES):",
           "if False:",
           ("tests/test_provenance.py::test_the_patch_never_copies_a_secret_and_lists_what_it_leaves_out",)),
    Mutant("only-rank-zero-writes-provenance", "project/engine/provenance.py",
           "        if not trainer.is_global_zero:\n            return\n        run_dir", "        run_dir",
           ("tests/test_ddp.py::test_callback_decisions_agree_on_all_ranks_and_only_rank_zero_writes",)),
    Mutant("best-checkpoint-follows-the-tasks-metric", "project/engine/monitored.py",
           "            self.monitor, self.mode = _judged_by(pl_module)\n            self.kth_value",
           '            self.monitor, self.mode = "val/loss", "min"\n            self.kth_value',
           ("tests/test_regression.py::test_the_regressor_is_judged_and_predicts_in_its_targets_units",)),
    Mutant("distributed-sampler-refused", "project/engine/checks.py",
           "    if trainer.use_distributed_sampler:",
           "    if False:",
           ("tests/test_config.py::test_bad_input_exits_non_zero_naming_the_key",)),
    Mutant("frozen-backbone-batchnorm-stays-in-eval", "project/engine/finetuning.py",
           "            module.eval()",
           "            pass",
           ("tests/test_pretrained.py::test_a_frozen_backbone_trains_from_its_unfreeze_epoch_at_its_own_lr",)),
    Mutant("backbone-learns-at-its-own-lr", "project/recipe.py",
           '[("backbone", backbone_lr_scale,', '[("backbone", 1.0,',
           ("tests/test_pretrained.py::test_a_frozen_backbone_trains_from_its_unfreeze_epoch_at_its_own_lr",)),
    Mutant("init-from-loads-what-fits", "project/engine/finetuning.py",
           "        loaded = load_matching(net, state, str(path), key, why_new=why_new)",
           "        loaded = load_matching(net, {}, str(path), key, why_new=why_new)",
           ("tests/test_pretrained.py::test_init_from_an_earlier_run_loads_what_fits_and_leaves_the_head_new",)),
    Mutant("profile-reported-when-the-run-ends-early", "project/engine/profiling.py",
           "        if self._profiler is not None:  # the run ended inside the window", "        if False:",
           ("tests/test_observability.py::test_profile_writes_a_chrome_trace_and_reports_the_top_ops",)),
    Mutant("progress-bar-reads-only-when-it-redraws", "project/engine/progress.py",
           "        if now < self._next_update and batch_idx + 1 < total and bar is not None:", "        if False:",
           ("tests/test_host_work.py::test_the_progress_bar_reads_its_metrics_only_as_often_as_it_redraws",)),
    Mutant("cpu-run-asks-nvml-nothing-per-step", "project/engine/task.py",
           '            os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)', "            pass",
           ("tests/test_host_work.py::test_a_run_on_the_cpu_asks_nvml_nothing_per_step",)),
    Mutant("token-weighted-step", "project/engine/task.py",
           '        if self.counted == "tokens" and self._window_tokens is not None:', "        if False:",
           (TOKENS_ACCUMULATION,)),
    Mutant("token-weighting-per-micro-batch-mean", "project/engine/task.py",
           "            loss, tokens = summed_over_tokens(losses, y)\n",
           "            loss, tokens = summed_over_tokens(losses, y)\n            loss = loss / tokens.clamp_min(1)\n",
           (TOKENS_ACCUMULATION,)),
    Mutant('token-count-summed-over-processes', 'project/engine/accumulation.py',
           'tokens = trainer.strategy.reduce(window_tokens, reduce_op="sum")',
           'tokens = window_tokens * trainer.world_size',
           ("tests/test_tokens.py::test_two_processes_with_unequal_token_counts_equal_one_process",)),
    Mutant("token-weighting-undoes-ddp-averaging", "project/engine/accumulation.py",
           "trainer.accumulate_grad_batches * trainer.world_size / tokens",
           "trainer.accumulate_grad_batches / tokens",
           ("tests/test_tokens.py::test_two_processes_with_unequal_token_counts_equal_one_process",)),
    Mutant("evaluation-loss-weighted-by-token", "project/engine/metrics.py",
           "        self.weight += weight.sum().to(self.weight.dtype)",
           "        self.weight += torch.ones_like(weight).sum().to(self.weight.dtype)",
           ("tests/test_tokens.py::test_the_evaluation_loss_is_the_token_weighted_mean_over_the_split",)),
    Mutant("validation-at-max-steps", "project/engine/monitored.py",
           "            trainer.should_stop = True\n", "            pass\n",
           ("tests/test_trainer_flags.py::test_a_step_based_run_validates_at_its_last_step",)),
    Mutant("validation-at-the-end-of-interval-counted-runs", "project/engine/monitored.py",
           "            last_batch and last_epoch and trainer.check_val_every_n_epoch is None\n", "            False\n",
           ("tests/test_trainer_flags.py::test_a_step_based_run_validates_at_its_last_step",)),
    Mutant("throughput-counts-tokens-not-padding", "project/engine/monitor.py",
           "(batch[1] != IGNORE_INDEX).sum()", "(batch[1] > -1000).sum()",
           ("tests/test_tokens.py::test_throughput_is_counted_in_tokens_and_flops",)),
    Mutant("integer-inputs-never-normalised", "project/engine/datamodule.py",
           "        if not self.input_dtype.is_floating_point:\n            return None",
           "        if False:\n            return None",
           (TOKENS_ACCUMULATION,)),  # the fixture keeps the engine's default, normalize=true
    Mutant("predict-reads-no-training-data", "project/engine/cli.py",
           'with restoring(getattr(self, "_learned", None)):', "with restoring(None):",
           (f"{PORTABLE_RUN}[regression]",)),
    Mutant("export-reads-no-training-data", "project/engine/runs.py",
           "with restoring(None if read_data else learned_in(saved)):", "with restoring(None):",
           (f"{PORTABLE_RUN}[images]",)),
    Mutant('the-configs-monitor-judges-the-run', 'project/engine/monitored.py',
           'return monitor, "max" if directions[monitor] else "min"',
           'return monitor, "min"',
           (CONFIGURED_MONITOR,)),
    Mutant("the-sweep-follows-the-configs-monitor", "project/engine/sweep/spec.py",
           "judged_by, direction = built.monitor, built.mode", "pass",
           (CONFIGURED_MONITOR,)),
    Mutant("the-prediction-file-carries-the-id-columns", "project/engine/predict.py",
           'carried = getattr(dm, "predict_columns" if on_a_file else "test_columns", {})', "carried = {}",
           (ID_COLUMNS, TEST_SPLIT_IDS)),
    Mutant("the-checkpoint-keeps-the-examples-targets", "project/engine/portable.py",
           '"example_targets": targets,', "",
           (NOTEBOOK_ON_A_COPY,)),
    Mutant('the-refused-runs-loggers-close-before-its-directory-goes', 'project/engine/run_directory.py',
           'logger.finalize("failed")',
           'pass',
           ("tests/test_observability.py::test_profiling_more_steps_than_the_run_has_is_refused_in_one_sentence",)),
    Mutant("new-project-renames-module-paths", "scripts/new_project.py",
           'r"(?<![\\w.-]){old}(?=\\.[A-Za-z_])",', 'r"(?!x)x",',
           (NEW_REPOSITORY,)),
    Mutant("a-left-out-example-leaves-the-packages-imports", "scripts/new_project.py",
           '    kept = [line for line in lines if not ((m := re.match(r"from ([\\w.]+) import ", line)) and m.group(1) '
           "in modules)]",
           "    kept = list(lines)",
           (NEW_REPOSITORY,)),
    Mutant("only-the-examples-that-are-there-count", "scripts/shipped_examples.py",
           ") and all(present(n, root) for n in example.needs)", ") or True",
           (NEW_REPOSITORY_TESTS,)),
    Mutant("an-example-declares-what-builds-on-it", "scripts/shipped_examples.json",
           '  "timm": {"needs": ["images"], "files": [', '  "timm": {"needs": [], "files": [',
           ("tests/test_shipped_examples.py::test_nothing_outside_an_example_names_its_code_or_its_configs",)),
    Mutant("a-left-out-examples-files-stay-behind", "copier.yml",
           '  - "{% for name in removed %}{% for file in examples[name].files %}{{ file }}\\n{% endfor %}{% endfor %}"',
           '  - "~nothing"',
           (NEW_REPOSITORY,)),
    Mutant("a-kept-example-brings-what-it-builds-on", "copier.yml",
           "    {%- set ns.kept = ns.kept + examples[name].needs -%}{%- endfor -%}{%- endfor -%}",
           "    {%- endfor -%}{%- endfor -%}",
           (NEW_REPOSITORY,)),
    Mutant("copier-renames-the-package", "copier.yml",
           '/scripts/new_project.py", "rename",', '/scripts/new_project.py", "check",',
           (NEW_REPOSITORY, ENGINE_UPDATE)),
    Mutant("copier-asks-for-a-package-name-python-can-import", "copier.yml",
           "    {% if not package | regex_search('^[a-z][a-z0-9_]*$') or package in ['and', 'as', 'assert', 'async', "
           "'await',",
           "    {% if false and package in ['and', 'as', 'assert', 'async', 'await',",
           (BAD_NEW_PROJECT,)),
    Mutant("copier-checks-the-answers-it-cannot-ask", "copier.yml",
           "    when: \"{{ _copier_operation == 'copy' }}\"", '    when: "{{ false }}"',
           (BAD_NEW_PROJECT, REFUSED_NEW_PROJECT)),
    Mutant("a-package-name-that-shadows-a-module-is-refused", "scripts/new_project.py",
           "    if name != OLD and (name in sys.stdlib_module_names or importlib.util.find_spec(name) is not None):",
           "    if False:",
           (BAD_NEW_PROJECT,)),
    Mutant("a-destination-holding-files-is-refused", "Makefile",
           '\t@! { test -e "$(DEST)" && { test ! -d "$(DEST)" || test -n "$$(ls -A "$(DEST)")"; }; } \\',
           "\t@true \\",
           (REFUSED_NEW_PROJECT,)),
    Mutant("absent-default-data-is-named", "tests/conftest.py",
           'if key in ("path", "root") and value is not None and not (root / str(value)).exists():', "if False:",
           ("tests/test_config.py::test_a_default_config_reading_data_the_checkout_lacks_is_named_in_one_sentence",)),
    Mutant("a-default-the-new-repository-cannot-run-is-refused", "scripts/new_project.py",
           "    if needed:", "    if False:",
           (REFUSED_NEW_PROJECT,)),
    Mutant("an-update-moves-the-templates-package-into-yours", "scripts/new_project.py",
           "        if target != source:  # into the package's new folder (over your file there: copier merges yours "
           "back)",
           "        if target != source and not target.exists():",
           (ENGINE_UPDATE,)),
    Mutant("an-update-leaves-your-own-files-alone", "scripts/new_project.py",
           '    rendered = [f for f in ours if f not in left_out and not f.startswith(".git/") and (dest / f)'
           ".is_file()]",
           '    rendered = [str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file() and ".git" not in '
           "p.parts]",
           (ENGINE_UPDATE,)),
    Mutant("an-update-leaves-conflict-markers", "Makefile",
           " --conflict inline ", " --conflict rej ",
           (ENGINE_UPDATE,)),
    Mutant("the-sweep-takes-the-tasks-direction", "project/engine/sweep/spec.py",
           'spec.direction = "maximize" if direction == "max" else "minimize"', 'spec.direction = "maximize"',
           ("tests/test_regression.py::test_the_sweep_optimises_the_tasks_metric_unless_told_otherwise",
            "tests/test_language_model.py::test_the_language_models_sweep_minimises_val_loss")),
    Mutant("an-unlogged-sweep-metric-is-refused", "project/engine/sweep/spec.py",
           "        if spec.metric is not None and spec.metric not in logged:", "        if False:",
           ("tests/test_sweep.py::test_a_metric_the_task_does_not_log_is_refused_before_anything_runs",)),
    Mutant("weights-where-nothing-fits-are-refused", "project/engine/weights.py",
           "    if not matching:\n        shaped", "    if False:\n        shaped",
           ("tests/test_pretrained.py::test_init_from_a_file_of_another_net_is_refused_and_leaves_no_run",)),
    Mutant("a-malformed-input-is-named", "project/engine/predict.py",
           "or (values.shape[1:] != input_shape and values.shape[1:] != (flat,)):",
           "or False:",
           ("tests/test_predict_export.py::test_a_malformed_input_file_gets_a_clear_error",)),
    Mutant("an-interrupt-saves-last-ckpt-at-once", "project/engine/last_checkpoint.py",
           "        elif stop:\n            self._save(trainer)", "        elif stop:\n            pass",
           ("tests/test_crash_safety.py::test_ctrl_c_or_sigterm_saves_a_checkpoint_and_says_how_to_resume",)),
    Mutant("make-runs-shows-the-recipe-first", "project/engine/runs.py",
           'key=lambda k: (order.get(k.partition(".")[0], 3), k))', "key=lambda k: k)",
           ("tests/test_provenance.py::test_make_runs_shows_the_recipes_keys_first_and_says_how_many_more_differ",)),
    Mutant("hparams-hold-the-final-scores", "project/engine/dashboard.py",
           "logger.log_hyperparams(params, metrics)",
           "logger.log_hyperparams(params)",
           ("tests/test_observability.py::test_the_hparams_view_holds_the_config_and_the_final_scores",)),
    Mutant("the-net-compiles-in-place", "project/engine/task.py",
           "            self.net.compile(**(", "            self.net = torch.compile(self.net, **(",
           ("tests/test_config.py::test_a_compiled_net_trains_and_its_checkpoint_loads_into_a_plain_one",)),
    # One per promise that had none: every promise is guarded by a mutant of its own.
    Mutant("the-accumulation-correction-holds-for-any-training-step", "project/engine/task.py",
           "        elif (correction := accumulation.",
           "        elif type(self).training_step is Task.training_step and (correction := accumulation.",
           ("tests/test_tasks.py::test_the_accumulation_correction_holds_for_a_task_with_its_own_training_step",)),
    Mutant('the-split-follows-its-own-seed', 'project/engine/datamodule.py',
           'order = torch.randperm(count, generator=torch.Generator().manual_seed(self.hparams["split_seed"]))',
           'order = torch.randperm(count, generator=torch.Generator().manual_seed(run_seed()))',
           ("tests/test_data.py::test_split_is_disjoint_complete_and_fixed_by_its_own_seed",)),
    Mutant("the-schedule-counts-optimizer-steps-under-ddp", "project/recipe.py",
           "    total = int(total)\n",
           "    total = int(total) * trainer.world_size\n",
           ("tests/test_ddp.py::test_lr_schedule_on_two_processes_is_the_closed_form",)),
    Mutant("evaluation-runs-in-eval-mode", "project/engine/task.py",
           "        super().train(mode)\n", "        super().train(True)\n",
           ("tests/test_mechanics.py::test_eval_runs_in_eval_mode_without_autograd_and_zero_grad_sets_none",)),
    Mutant("each-rank-takes-its-own-shard", "project/engine/datamodule.py",
           "rank=rank, shuffle=True, seed=run_seed(), drop_last=True",
           "rank=0, shuffle=True, seed=run_seed(), drop_last=True",
           ("tests/test_ddp.py::test_each_rank_trains_on_its_exact_shard_of_the_seeded_permutation",)),
    Mutant("every-rank-shards-one-permutation", "project/engine/datamodule.py",
           "rank=rank, shuffle=True, seed=run_seed(), drop_last=True",
           "rank=rank, shuffle=True, seed=run_seed() + rank, drop_last=True",
           ("tests/test_ddp.py::test_ddp_weights_equal_one_process_on_the_combined_batch",
            "tests/test_ddp.py::test_one_process_sees_the_same_global_batches_in_the_same_order")),
    Mutant("a-ddp-resume-skips-this-ranks-batches", "project/engine/samplers.py",
           "self.sampler.skip_next(skip * self.batch_size)",
           "self.sampler.skip_next(skip * self.batch_size * self.sampler.num_replicas)",
           ("tests/test_ddp.py::test_ddp_resume_from_mid_epoch_equals_the_uninterrupted_run",)),
    Mutant("a-stopped-run-says-why", "project/engine/cli.py",
           "            if stopper.stopping_reason_message and trainer.is_global_zero:", "            if False:",
           ("tests/test_mechanics.py::test_early_stopping_waits_patience_epochs_then_stops",)),
    Mutant("the-final-test-uses-the-best-checkpoint", "project/engine/cli.py",
           "trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best, weights_only=True)",
           "trainer.test(self.model, datamodule=self.datamodule, ckpt_path=None, weights_only=True)",
           ("tests/test_mechanics.py::test_a_non_finite_monitored_value_stops_the_run_with_a_message",)),
    Mutant("a-failed-write-leaves-no-temp-file", "project/engine/checkpoints.py",
           "            tmp.unlink(missing_ok=True)\n            raise _write_failed",
           "            raise _write_failed",
           ("tests/test_crash_safety.py::test_a_full_disk_stops_the_run_in_one_sentence_keeps_its_checkpoints_and_resumes_exactly",)),
    Mutant("an-unreadable-checkpoint-is-one-sentence", "project/engine/checkpoints.py",
           "    except Exception as err:\n        raise ConfigError(",
           "    except ImportError as err:\n        raise ConfigError(",
           ("tests/test_crash_safety.py::test_bad_checkpoint_inputs_each_get_one_clear_sentence",)),
    Mutant("throughput-counts-samples", "project/engine/monitor.py",
           "self._samples += len(batch[0]) if", "self._samples += 1 if",
           ("tests/test_observability.py::test_throughput_and_data_wait_are_consistent_and_quiet_when_data_is_fast",)),
    Mutant("data-wait-is-timed-inside-the-loader", "project/engine/monitor.py",
           "            self._wait, self._loader_wait_seen = loader_wait - self._loader_wait_seen, loader_wait",
           "            self._loader_wait_seen = loader_wait",
           ("tests/test_observability.py::test_a_slow_dataset_shows_in_data_wait_and_warns_once",)),
    Mutant("a-line-per-epoch-without-a-terminal", "project/engine/monitor.py",
           "        if not sys.stdout.isatty():\n            metrics", "        if False:\n            metrics",
           ("tests/test_observability.py::test_the_console_log_stays_readable_without_a_terminal",)),
    Mutant("the-latest-run-is-a-run-directory", "project/engine/runs.py",
           "return checkpoints[-1].parent.parent if checkpoints", "return checkpoints[-1].parent if checkpoints",
           ("tests/test_notebooks.py::test_inspect_run_notebook_trains_a_tiny_run_when_there_is_none",)),
    Mutant("the-bench-reads-parquet-as-parquet", "benchmarks/bench.py",
           'pq.read_table(path) if path.endswith(".parquet") else pa_csv.read_csv(path)', "pa_csv.read_csv(path)",
           ("tests/test_table.py::test_the_table_workload_reads_one_table_both_ways",)),
    Mutant("the-export-batch-is-dynamic", "project/engine/export.py",
           '    dynamic: dict[int, Any] = {0: torch.export.Dim("batch")}', "    dynamic: dict[int, Any] = {}",
           ("tests/test_predict_export.py::test_export_round_trip_with_parity_and_a_dynamic_batch",)),
    Mutant("make-predict-reads-the-best-checkpoint", "Makefile",
           "--ckpt_path $(RUN)/checkpoints/best.ckpt \\", "--ckpt_path $(RUN)/checkpoints/final.ckpt \\",
           ("tests/test_readme.py::test_every_command_the_manual_shows_runs_and_resolves",)),
    Mutant("the-gpu-check-fits-every-precision", "scripts/gpu_check.sh",
           'for extra in "--trainer.precision=32-true" "--trainer.precision=bf16-mixed" \\',
           'for extra in "--trainer.precision=32-true" \\',
           ("tests/test_gpu_check.py::test_the_gpu_check_script_runs_every_command_on_the_cpu",)),
    Mutant("the-reference-loop-follows-the-schedule", "benchmarks/bench.py",
           "            scheduler.step()\n", "            pass\n",
           ("tests/test_bench.py::test_reference_loop_and_template_do_the_same_work",)),
    Mutant("a-segment-says-it-stopped-early", "project/engine/provenance.py",
           "        if stopper.stopped_epoch:\n", "        if False:\n",
           ("tests/test_provenance.py::test_each_run_records_what_produced_it_and_how_each_segment_ended",)),
    Mutant("make-runs-imports-no-torch", "project/engine/runs.py",
           "import argparse\n", "import argparse\n\nimport torch  # noqa: F401\n",
           ("tests/test_provenance.py::test_make_runs_does_not_import_the_training_stack",)),
    Mutant("train-and-val-loss-share-a-chart", "project/engine/dashboard.py",
           '[r"^(train|val)/loss$"]', '[r"^train/loss$"]',
           ("tests/test_observability.py::test_a_real_tensorboard_server_serves_the_curves_the_curated_layout_and_the_provenance",)),
    Mutant("a-dead-workers-trial-is-retried", "project/engine/sweep/workers.py",
           '            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})\n            reaped',
           "            reaped",
           ("tests/test_sweep.py::test_a_killed_worker_leaves_its_trial_to_be_retried_and_the_study_finishes",)),
    Mutant("best-yaml-leaves-the-sweep-out", "project/engine/sweep/report.py",
           'trainer["callbacks"] = [cb for cb in trainer.get("callbacks") or [] '
           'if cb.get("class_path") != SWEEP_CALLBACK]',
           "pass",
           ("tests/test_sweep.py::test_best_yaml_trains_the_best_trial_again_to_the_same_metric",)),
    Mutant("a-pruned-trial-is-recorded-pruned", "project/engine/sweep/trial.py",
           '                self._trial.set_user_attr("pruned_at_epoch", trainer.current_epoch)',
           "                pass",
           ("tests/test_sweep.py::test_a_ddp_trial_is_pruned_on_every_rank_at_the_same_epoch",)),
    Mutant("an-interrupted-trial-is-queued-again", "project/engine/sweep/workers.py",
           '        if interrupted:  # the next `make sweep` runs these values again\n            study.enqueue_trial(',
           "        if interrupted:\n            (lambda *a, **k: None)(",
           ("tests/test_sweep.py::test_ctrl_c_stops_the_sweep_with_a_checkpoint_and_queues_the_trial_again",)),
    Mutant("a-failed-trial-keeps-its-reason", "project/engine/sweep/workers.py",
           '        trial.set_user_attr("error", result)', "        pass",
           ("tests/test_sweep.py::test_trials_that_fail_are_recorded_with_their_reason_and_the_worker_goes_on",)),
    Mutant("an-empty-range-is-refused", "project/engine/sweep/spec.py",
           "    if p.low > p.high:", "    if False:",
           ("tests/test_sweep.py::test_a_bad_space_is_refused_before_anything_runs",)),
    Mutant('fine-tuning-needs-a-backbone', 'project/engine/finetuning.py',
           "    if (freeze_backbone or backbone_lr_scale != 1.0) and not isinstance(",
           "    if False and not isinstance(",
           ("tests/test_pretrained.py::test_fine_tuning_a_net_without_a_backbone_is_refused_saying_what_a_backbone_is",)),
    Mutant("predict-restores-no-checkpoint-callbacks", "project/engine/cli.py",
           "if not issubclass(kind_of(cb), Checkpoint)]",
           "]",
           ("tests/test_contract.py::test_predict_writes_the_tasks_columns_and_test_scores_the_same_outputs[default]",)),
    Mutant("a-step-based-bar-gives-its-steps", "project/engine/progress.py",
           "        if self.trainer.max_epochs in (None, -1) and self.trainer.max_steps > 0:", "        if False:",
           ("tests/test_host_work.py::test_a_step_based_runs_bar_gives_its_length_in_steps",)),
)  # fmt: skip


# The machinery's files: a mutant of any other file (a task, a DataModule, a net, a config, the README: yours) is
# left out once that file no longer holds its line, so rewording or restructuring your files never breaks this.
def _here(mutant: Mutant) -> Mutant | None:
    """The mutant with only the tests this repository has (an example deleted: its files and tests go with it);
    None when its file or every one of its tests is gone. Every mutant edits the template's own machinery (the
    engine, the recipe, scripts, the Makefile), never a line of your tasks, data, nets, configs or manual."""
    tests = tuple(t for t in mutant.tests if (ROOT / t.partition("::")[0]).is_file())
    if not (tests and (ROOT / mutant.file).is_file()):
        return None
    return mutant._replace(tests=tests)


MUTANTS = tuple(m for m in map(_here, SHIPPED) if m is not None)


def _copy_of_the_checkout(into: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in files.stdout.split("\0"):
        if name and (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)
    # A git checkout of its own, as yours is (provenance, copier and the suite's clean-tree check read it).
    git = ["git", "-c", "user.name=mutants", "-c", "user.email=mutants@localhost"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the checkout, unmutated"]):
        subprocess.run([*git, *step], cwd=into, check=True, capture_output=True)
    return into


def _pytest(copy: Path, tests: list[str], python: str, workers: int = 0) -> tuple[int, float, str]:
    """Runs ``tests`` against ``copy`` (its own package first on the path, for subprocesses too), stopping at the
    first failure; in ``workers`` processes (as `make test` does) when > 0."""
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    for key in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "ARGS"):
        env.pop(key, None)
    start = time.monotonic()
    result = subprocess.run(
        [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", str(workers),
         *(["--dist", "loadscope", "--no-loadscope-reorder"] if workers else []), *(str(copy / t) for t in tests)],
        cwd=copy, env=env, capture_output=True, text=True,
    )  # fmt: skip
    tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-3:])
    return result.returncode, time.monotonic() - start, tail


def run(mutant: Mutant, python: str, tests: list[str] | None = None, workers: int = 0) -> tuple[str, float, str]:
    """(outcome, seconds, last lines): killed (a test failed), survived (they all passed) or broken."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as scratch:
        copy = _copy_of_the_checkout(Path(scratch))
        target = copy / mutant.file
        source = target.read_text()
        if source.count(mutant.original) != 1:
            return "broken", 0.0, f"{mutant.file} does not hold its line exactly once: {mutant.original!r}"
        target.write_text(source.replace(mutant.original, mutant.mutated))
        # Its own tests first, also for the whole suite: they are part of it, so a mutant they kill the whole suite
        # kills too, and only the mutants they let live cost a run of everything.
        code, seconds, tail = _pytest(copy, list(mutant.tests), python)
        if tests and code == 0:
            code, more, tail = _pytest(copy, tests, python, workers)
            seconds += more
        if code == 0:
            return "survived", seconds, tail
        if code == 1:  # pytest: the tests ran and one failed
            return "killed", seconds, tail
        return "broken", seconds, tail  # collection error, no test selected, ...


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants (names as listed)")
    parser.add_argument("--whole-suite", action="store_true",
                        help="run the whole suite (tests/, in parallel, stopping at the first failure) against "
                        "each mutant instead of its own tests: a survivor there is a line no test notices")  # fmt: skip
    args = parser.parse_args()
    workers = min(os.cpu_count() or 1, 4) if args.whole_suite else 0
    whole = ["tests"] if args.whole_suite else None
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.only and len(chosen) != len(args.only):
        known = ", ".join(m.name for m in MUTANTS)
        print(f"error: --only {' '.join(args.only)}: unknown mutant name; known: {known}", file=sys.stderr)
        return 2
    # First the same tests without any mutant: a test that fails anyway would count every mutant as killed.
    with tempfile.TemporaryDirectory(prefix="mutants-baseline-") as scratch:
        tests = whole or list(dict.fromkeys(t for m in chosen for t in m.tests))
        code, seconds, tail = _pytest(_copy_of_the_checkout(Path(scratch)), tests, sys.executable, workers)
    what = "the whole suite" if whole else f"the {len(tests)} tests"
    print(f"{'baseline':9} {seconds:6.1f} s  {what}, unmutated: {'pass' if code == 0 else 'FAIL'}")
    if code != 0:
        print("          " + tail.replace("\n", "\n          "))
        return 2
    outcomes = []
    for mutant in chosen:
        outcome, seconds, tail = run(mutant, sys.executable, whole, workers)
        outcomes.append(outcome)
        print(f"{outcome:9} {seconds:6.1f} s  {mutant.name}  ({mutant.file})", flush=True)
        if outcome != "killed":
            print("          " + tail.replace("\n", "\n          "), flush=True)
    survived, broken = outcomes.count("survived"), outcomes.count("broken")
    print(f"{len(chosen)} mutants: {outcomes.count('killed')} killed, {survived} survived, {broken} broken "
          f"({'whole suite' if whole else 'each against its own tests'})")  # fmt: skip
    return 1 if survived or broken else 0


if __name__ == "__main__":
    sys.exit(main())
