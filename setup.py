from setuptools import find_packages, setup

setup(
    name="fairseq-pe",
    version="0.2.0",
    description="Position encodings for fairseq: absolute, relative, FLOATER; length-extrapolation tooling",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["fairseq_pe", "fairseq_pe.*"]),
    python_requires=">=3.8",
    install_requires=[
        # official fairseq 0.12.2 does not import on Python >= 3.11; fairseq-fixed is the
        # same `fairseq` package (upstream main of early 2024) with the 3.11 fix
        "fairseq==0.12.2; python_version < '3.11'",
        "fairseq-fixed==0.12.3.1; python_version >= '3.11'",
        "torch>=1.13",
        "torchdiffeq>=0.2.3",
        "sacrebleu>=2.0",
        "sentencepiece>=0.1.99",
        "rotary-embedding-torch>=0.8",
        "matplotlib>=3.5",
        "sacremoses>=0.0.53",
        "scikit-learn>=1.0",  # GLUE metrics (accuracy, F1, Matthews correlation)
        "scipy>=1.7",  # GLUE metrics (Pearson, Spearman)
        "numpy",
        "wrapt>=1.14",  # registers the plugin when fairseq is imported (fairseq_pe/__init__.py)
    ],
    extras_require={
        # fairseq-pe-analyze on Hugging Face model folders (their config and position table)
        "hf": ["transformers>=4.30"],
        # with transformers, so that the tests of Hugging Face folders run (CI installs .[test]), and pytest-xdist
        # (scripts/run_tests.sh runs the suite in one process per core)
        "test": ["pytest>=7", "pytest-xdist>=3", "transformers>=4.30"],
    },
    entry_points={
        "console_scripts": [
            "fairseq-pe-quickstart = fairseq_pe.translation.quickstart:main",
            "fairseq-pe-warm-start-floater = fairseq_pe.warm_start.floater:cli_main",
            "fairseq-pe-prepare-wmt14 = fairseq_pe.data_prep.wmt14:main",
            "fairseq-pe-s2l-split = fairseq_pe.translation.s2l:main",
            "fairseq-pe-bucket-bleu = fairseq_pe.translation.bucket_bleu:main",
            "fairseq-pe-bucket-loss = fairseq_pe.translation.bucket_loss:main",
            "fairseq-pe-prepare-squad = fairseq_pe.data_prep.squad:main",
            "fairseq-pe-squad-predict = fairseq_pe.bert.squad:main",
            "fairseq-pe-prepare-mono = fairseq_pe.data_prep.mono:main",
            "fairseq-pe-warm-start-roberta = fairseq_pe.warm_start.roberta:cli_main",
            "fairseq-pe-prepare-glue = fairseq_pe.data_prep.glue:main",
            "fairseq-pe-glue-eval = fairseq_pe.bert.glue:main",
            "fairseq-pe-analyze = fairseq_pe.analysis.cli:main",
            "fairseq-pe-average-checkpoints = fairseq_pe.average_checkpoints:main",
            "fairseq-pe-prepare-wikitext = fairseq_pe.data_prep.wikitext:main",
            "fairseq-pe-lm-lengths = fairseq_pe.lm.extrapolation:main",
            "fairseq-pe-lm-curves = fairseq_pe.lm.curves:main",
            "fairseq-pe-counting = fairseq_pe.lm.counting:main",
            "fairseq-pe-benchmark = fairseq_pe.benchmark.cli:main",
            "fairseq-pe-gpu-check = fairseq_pe.benchmark.gpu_check.cli:main",
            "fairseq-pe-count-ops = fairseq_pe.benchmark.count_ops:main",
            "fairseq-pe-sdpa-arguments = fairseq_pe.benchmark.sdpa_arguments:main",
        ],
    },
)
