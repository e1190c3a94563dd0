"""The tests that run the console scripts as a user runs them, once per run of the suite (issue 40, 7).

``helpers.cli`` runs a console script as a process forked from the tests' fork server (``cli_server.py``), which
has imported torch and fairseq already: such a run never starts an interpreter, never runs the wrapper that pip
installed in the environment's ``bin``, and registers the plugin at once instead of through its post-import hook
(``fairseq_pe/__init__.py``) where a ``fairseq-pe-*`` tool imports the plugin before fairseq.  The tests named below
run every command of theirs in a new interpreter instead, through that wrapper (conftest.py sets
``FAIRSEQ_PE_TEST_FORK=0`` for them and marks them ``fresh_interpreter``: ``pytest -m fresh_interpreter`` runs only
them), and each fails unless it ran the console scripts it is named for that way (``helpers.FRESH_RUNS``).

Together they run, with a real small job whose output they check, every console script of this package and every
``fairseq-*`` script that the tests or the docs run (``test_fresh_interpreters.py`` checks the list against the
installed entry points), among them a user error of a fairseq run with ``--user-dir`` and of a plugin tool (exit
status 2, one line, no traceback).  ``test_cli_server.py`` runs its commands both ways itself (forked and new,
compared line by line), so conftest.py leaves its environment alone.

A test marked ``shared_data`` runs only where ``../shared/data`` is (CI); where a tool has one, a second test that
needs no real data is named too.
"""

#: console script -> the tests (``FILE::NAME[PARAMETERS]`` under tests/) that run it in a new interpreter
FRESH_SUBSET = {
    "fairseq-preprocess": ["test_cli_server.py::test_fairseq_train_generate_and_a_plugin_tool_as_a_new_interpreter"],
    "fairseq-train": ["test_cli_server.py::test_fairseq_train_generate_and_a_plugin_tool_as_a_new_interpreter"],
    "fairseq-validate": ["test_cli_server.py::test_fairseq_train_generate_and_a_plugin_tool_as_a_new_interpreter"],
    "fairseq-generate": ["test_cli_server.py::test_fairseq_train_generate_and_a_plugin_tool_as_a_new_interpreter"],
    "fairseq-pe-warm-start-floater": [
        "test_cli_server.py::test_fairseq_train_generate_and_a_plugin_tool_as_a_new_interpreter"],
    "fairseq-pe-analyze": ["test_analyze_tables.py::test_command_on_hugging_face_folders_and_raw_tables"],
    "fairseq-pe-average-checkpoints": [
        "test_fairseq_features_cli.py::test_layerdrop_ema_averaging_pruning_and_retained_dropout[rope]"],
    "fairseq-pe-bucket-loss": ["test_bucket_loss.py::test_the_console_script_scores_beyond_the_table_or_refuses"],
    "fairseq-pe-bucket-bleu": ["test_bucket_bleu.py::test_lengths_file_and_subword_segmentation_undone"],
    "fairseq-pe-quickstart": ["test_quickstart.py::test_synthetic"],
    "fairseq-pe-s2l-split": ["test_s2l_split.py::test_cli_word_unit"],
    "fairseq-pe-prepare-mono": ["test_fresh_interpreters.py::test_prepare_mono_then_glue_with_its_pieces"],
    "fairseq-pe-prepare-glue": ["test_fresh_interpreters.py::test_prepare_mono_then_glue_with_its_pieces"],
    "fairseq-pe-warm-start-roberta": ["test_roberta_pe.py::test_warm_start_to_another_encoding_initialises_it"],
    "fairseq-pe-prepare-wmt14": ["test_data_prep_wmt14.py::test_prepare_en_de_end_to_end",
                                 "test_data_prep_wmt14.py::test_empty_raw_dir_lists_every_missing_file[en-de]"],
    "fairseq-pe-glue-eval": ["test_glue.py::test_end_to_end[ape-learned]"],
    "fairseq-pe-prepare-squad": [
        "test_squad.py::test_end_to_end_pretrain_128_finetune_and_predict_longer[v1.1-ape-learned]"],
    "fairseq-pe-squad-predict": [
        "test_squad.py::test_end_to_end_pretrain_128_finetune_and_predict_longer[v1.1-ape-learned]"],
    "fairseq-pe-prepare-wikitext": ["test_data_prep_lm.py::test_prepare_wikitext_downloads_and_binarises_word_level",
                                    "test_data_prep_lm.py::test_prepare_wikitext_on_the_wikitext2_raw_files"],
    "fairseq-pe-lm-lengths": ["test_lm_tools.py::test_stock_model_that_skips_samples_is_an_error"],
    "fairseq-pe-counting": ["test_counting.py::test_counting_tool_end_to_end"],
    "fairseq-pe-lm-curves": ["test_lm_curves.py::test_the_command_writes_its_table_json_and_picture"],
    "fairseq-pe-benchmark": [
        "test_benchmark_script.py::test_benchmark_script_encoder_memory_only_with_a_left_padded_batch"],
    "fairseq-pe-gpu-check": ["test_gpu_check.py::test_without_cuda_it_says_so_and_exits_0_and_it_checks_on_the_cpu"],
    "fairseq-pe-count-ops": ["test_host_syncs.py::test_the_console_script_counts_and_writes_the_operators"],
    "fairseq-pe-sdpa-arguments": ["test_kernel_choices.py::test_the_console_script_prints_the_rows_of_speed_md"],
    "fairseq-interactive": ["test_lm.py::test_interactive_and_the_hub_generate_from_a_trained_model"],
    "fairseq-eval-lm": ["test_lm_tools.py::test_stock_model_that_skips_samples_is_an_error"],
    "fairseq-hydra-train": ["test_hydra.py::test_fairseqs_roberta_pretraining_config_runs_with_roberta_pe"],
}
#: the modules that run their commands both ways themselves
BOTH_WAYS = ("test_cli_server.py",)


def expected_scripts(test: str):
    """The console scripts that ``test`` (``FILE::NAME[PARAMETERS]``) must run in a new interpreter."""
    return sorted(script for script, tests in FRESH_SUBSET.items() if test in tests)


def tests():
    return sorted({t for ts in FRESH_SUBSET.values() for t in ts})
