"""The options of ``fairseq-pe-benchmark`` that every measurement takes (where the results go, the systems, the
models' size, the vocabulary, threads, rounds, device and precision), and the checks of the whole command line that
follow each measurement's own (:func:`check_options`).  Each measurement module adds its group of options
(``add_options``) and checks them (``check_options``); :func:`fairseq_pe.benchmark.cli.parse_args` puts them
together.
"""

import shlex

from fairseq_pe.benchmark.models import LM_SIZES, SIZES, STOCK, SYSTEMS
from fairseq_pe.errors import UserError


def add_options(p):
    """The options every measurement takes."""
    p.add_argument("--out", default="benchmark-work", help="results and work files")
    p.add_argument("--force", action="store_true", help="replace the results of an earlier run in --out")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=[STOCK] + list(SYSTEMS),
                   help="the plugin systems to measure (default: all); stock is always measured")
    p.add_argument("--size", choices=list(dict.fromkeys([*SIZES, *LM_SIZES])),
                   help="stock transformer_wmt_en_de vs transformer_pe_wmt_en_de (wmt, the default), "
                        "transformer_iwslt_de_en vs transformer_pe_iwslt_de_en (iwslt), or stock transformer with 2+2 "
                        "layers, 64 dims, 4 heads, FFN 256 vs transformer_pe_tiny (tiny, for smoke tests); with --lm: "
                        "stock transformer_lm vs transformer_lm_pe (base, the default: 6 layers, 512 dims), "
                        "transformer_lm_gpt2_small vs transformer_lm_pe_gpt2_small (gpt2-small), or stock "
                        "transformer_lm with 2 layers, 64 dims, 4 heads, FFN 256 vs transformer_lm_pe_tiny (tiny)")
    p.add_argument("--arch", help="the plugin's architecture (overrides --size)")
    p.add_argument("--stock-arch", help="stock fairseq's architecture (overrides --size)")
    p.add_argument("--stock-flags", metavar="'FLAGS'",
                   help="model flags of the stock architecture, one string (overrides --size's), given as "
                        "--stock-flags='--encoder-layers 2 ...'")
    p.add_argument("--vocab", type=int, default=8000, help="words of the shared vocabulary")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of every measurement")
    p.add_argument("--repeats", type=int, default=3, help="timing rounds; the fastest counts")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where every system runs: the CPU (default) or the first CUDA GPU; memory is then the GPU's")
    precision = p.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true", help="fairseq's --fp16 (needs --device cuda)")
    precision.add_argument("--bf16", action="store_true", help="fairseq's --bf16")


def check_options(args):
    """The counts and lengths at least 1, the device (a CUDA GPU for --device cuda, named in the results) and
    precision, the models of --size (the mode's) with --arch, --stock-arch and --stock-flags over them."""
    for flag in ("updates", "max_tokens", "vocab", "sentences", "gen_sentences", "gen_len", "threads", "repeats"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if min(args.lengths) < 1:
        raise UserError(f"--lengths must be at least 1, got {min(args.lengths)}")
    args.lengths = list(dict.fromkeys(args.lengths))
    args.gpu_name = None
    if args.fp16 and args.device != "cuda":
        raise UserError("--fp16 needs --device cuda (fairseq's fp16 training is for GPUs); on the CPU use --bf16")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--device cuda: this torch sees no CUDA GPU "
                            f"(torch {torch.__version__}, CUDA {torch.version.cuda}); leave --device out for the CPU")
        args.gpu_name = torch.cuda.get_device_name(0)
    sizes, args.size = (LM_SIZES, args.size or "base") if args.lm else (SIZES, args.size or "wmt")
    if args.size not in sizes:
        raise UserError(f"--size {args.size}: {'with' if args.lm else 'without'} --lm, --size takes "
                        f"{', '.join(sizes)}")
    stock_arch, stock_flags, arch = sizes[args.size]
    args.arch = args.arch or arch
    args.stock_arch = args.stock_arch or stock_arch
    args.stock_flags_list = shlex.split(args.stock_flags) if args.stock_flags is not None else list(stock_flags)
    args.stock_flags = " ".join(args.stock_flags_list)
    for flag in ("--user-dir", "--arch"):
        if flag in args.stock_flags_list:
            raise UserError(f"--stock-flags cannot hold {flag}")
