"""fairseq-pe-analyze: position-encoding analysis of fairseq checkpoints and position tables (Wang et al. 2021).

    fairseq-pe-analyze INPUT [INPUT ...] --out DIR

An INPUT is
  - a fairseq checkpoint (``transformer_pe``, ``roberta_pe``, or fairseq's stock ``transformer`` /
    ``roberta``; no data directory needed): its encoder is analysed (``--side decoder``: a translation
    model's decoder);
  - a position table, one row per position (positions × D): a .npy file, or a .pt file holding one
    2-D tensor (or a dict of exactly one);
  - a Hugging Face model folder (with config.json: ``save_pretrained``, ``huggingface-cli download``;
    needs ``pip install 'fairseq-pe[hf]'``): its position table is read, nothing else, and nothing
    is downloaded.  BERT, ALBERT, ELECTRA, DistilBERT, RoBERTa, XLM-RoBERTa, CamemBERT:
    embeddings.position_embeddings (RoBERTa and its kin number positions from pad_token_id + 1, so
    their first pad_token_id + 1 rows are dropped); GPT-2, GPT-Neo: wpe.
A position table gets the analyses of absolute vectors only (absolute.png, profiles.png, norms.png,
probe.png and their scores); the ones that need a model's attention (identical-word probing, relative
vectors, learned frequencies) are skipped, and its report.md, scores.json ("skipped") and
properties.md say so.  --side decoder, --num-tokens, --seed and --user-dir apply to checkpoints and
are refused when every INPUT is a table.

For each INPUT it writes DIR/NAME/:
  report.md           the scores and the pictures below, with what they mean
  scores.json         every score (per block, per head)
  matrices.npz        the proximity matrices and identical-word logits
  absolute.png        dot products and cosines of the absolute position vectors (Fig. 2, top)
  relative.png        dot products of Shaw-style relative vectors (Fig. 2, bottom)
  identical-word.png  first-layer logits of one repeated word, mean and per head (Fig. 3)
  profiles.png        φ(x, x+m) against the offset m
  frequencies.png     learned against initial frequencies and their ψ(m) (App. A.5)
  probe.png           error of the position regression probe per held-out position
(only those that apply), and in DIR one table of property scores for all INPUTs:
  properties.md, properties.json, report.md, identical-word.png, absolute.png.

NAME is a checkpoint's folder name, a table file's stem or a Hugging Face folder's name unless
--names is given.  Files of an earlier analysis in DIR are replaced only with --force (pictures it
does not draw this time are removed then); every file is written atomically, and nothing is ever
written over an INPUT.
"""

import argparse
import logging
import os
import sys
from typing import List, Optional

from fairseq_pe.analysis.report import DEFAULT_LENGTH, DEFAULT_PROBE_LENGTH
from fairseq_pe.errors import UserError, cli


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fairseq-pe-analyze", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", metavar="INPUT",
                   help="fairseq checkpoint files (.pt), position tables (.npy, or .pt of one 2-D tensor) or Hugging "
                        "Face model folders (with config.json)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the reports (created)")
    p.add_argument("--names", nargs="+", default=None, metavar="NAME",
                   help="one name per INPUT (default: a checkpoint's folder name, a table's file stem, a "
                        "Hugging Face folder's name)")
    p.add_argument("--length", type=int, default=None,
                   help=f"positions of the matrices and heatmaps (default {DEFAULT_LENGTH}, or the table size "
                        "if smaller)")
    p.add_argument("--probe-length", type=int, default=None,
                   help=f"positions of the regression probe (default {DEFAULT_PROBE_LENGTH}, or the table size "
                        "if smaller)")
    p.add_argument("--num-tokens", type=int, default=None,
                   help="random words averaged in identical-word probing (default 100, or every word of a "
                        "smaller dictionary); checkpoints only")
    p.add_argument("--max-offset", type=int, default=32,
                   help="largest offset counted in the Eq. 2 share of monotonicity (default 32)")
    p.add_argument("--seed", type=int, default=None, help="seed of the random words (default 0); checkpoints only")
    p.add_argument("--side", choices=["encoder", "decoder"], default="encoder",
                   help="which stack of a translation model to analyse (default: the encoder; RoBERTa has "
                        "only an encoder). On the decoder, identical-word logits exist for keys up to the query")
    p.add_argument("--trained-length", type=int, default=None, metavar="N",
                   help="the longest training sequence in positions, marked on norms.png (default: what the "
                        "checkpoint records, for masked LM its --tokens-per-sample)")
    p.add_argument("--user-dir", default=None,
                   help="another fairseq plugin to import first, for checkpoints of its models")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--force", action="store_true",
                   help="replace the files of an earlier analysis in DIR (default: refuse)")
    return p


def refuse_checkpoint_options(args: argparse.Namespace):
    """When every INPUT is a position table, the options that concern checkpoints only are errors."""
    why = {"--side decoder": "a position table has no decoder",
           "--num-tokens": "identical-word probing needs a model's attention",
           "--seed": "it draws the words of identical-word probing, which needs a model's attention",
           "--user-dir": "it imports a plugin's models"}
    given = {"--side decoder": args.side == "decoder", "--num-tokens": args.num_tokens is not None,
             "--seed": args.seed is not None, "--user-dir": args.user_dir is not None}
    for flag, present in given.items():
        if present:
            raise UserError(f"{flag} applies to fairseq checkpoints only ({why[flag]}), and every INPUT is a "
                            f"position table ({', '.join(args.checkpoints)}): leave {flag.split()[0]} out")


@cli
def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    # force: importing fairseq has configured the root logger already
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s", force=True)
    for noisy in ("fairseq", "fairseq_pe.models", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.max_offset < 1:
        raise UserError(f"--max-offset must be >= 1, got {args.max_offset}")
    from fairseq_pe.analysis.tables import input_kind

    if all(input_kind(path) != "checkpoint" for path in args.checkpoints):
        refuse_checkpoint_options(args)
    if args.user_dir:
        if not os.path.isdir(args.user_dir):
            raise UserError(f"--user-dir {args.user_dir}: no such folder")
        from fairseq import utils

        utils.import_user_module(argparse.Namespace(user_dir=args.user_dir))
    from fairseq_pe.analysis import AnalysisOptions, analyze_checkpoints

    options = AnalysisOptions(length=args.length, probe_length=args.probe_length, num_tokens=args.num_tokens,
                              max_offset=args.max_offset, seed=0 if args.seed is None else args.seed, side=args.side,
                              trained_length=args.trained_length)
    # AnalysisError and CheckpointError are UserErrors: "fairseq-pe-analyze: error: ...", status 2
    analyses = analyze_checkpoints(args.checkpoints, args.out, names=args.names, options=options, force=args.force)
    with open(f"{args.out}/properties.md") as f:
        print(f.read(), end="")
    print(f"wrote {args.out}/report.md, {args.out}/properties.md/.json and "
          + ", ".join(f"{args.out}/{a.name}/" for a in analyses), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
