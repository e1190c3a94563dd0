"""Host syncs and operators per step, for every encoding, counted on the CPU (``fairseq-pe-count-ops``:
``fairseq_pe/benchmark/count_ops.py``).

On a GPU a training step waits for the device at each host sync (``.item()``, ``bool()`` of a tensor, a size that
depends on the data, a copy to the host), and step-by-step decoding is bound by the number of operators it launches.
Targets: no encoding syncs more than stock fairseq's own code in a training step (forward, backward, gradient norm,
optimizer step through fairseq's Trainer), in an encoder pass in evaluation or in a decoding step; a decoding step
runs at most 1.15× the operators of the sinusoidal APE's (1.5× for FoX, CoPE, DAPE and ReRoPE, which compute the
logits themselves from the layer's data or from two products of every key: ``count_ops.OWN_LOGITS``).  The counter itself (``fairseq_pe/diagnostics/op_count.py``)
sees on the CPU what syncs on a GPU only, and takes the package's CUDA-only branches.
"""

import ast
import json
import os

import pytest
import torch

from fairseq_pe.benchmark import count_ops

from helpers import REPO, build_model, cli, random_tokens
from passes import recorded_passes


def test_no_encoding_syncs_more_than_stock_or_decodes_with_more_operators_than_its_ratio_to_the_apes():
    counts = count_ops.count(list(count_ops.SYSTEMS))
    stock, reference = counts[count_ops.STOCK], counts[count_ops.REFERENCE]
    # the counts are real: stock fairseq's own syncs are there to be matched (its padding checks, the gradient norm)
    assert stock["train"].syncs > 0 and stock["decode"].syncs > 0 and reference["decode"].total > 100
    failures = []
    for name, c in counts.items():
        if name == count_ops.STOCK:
            continue
        for kind, what in count_ops.KINDS.items():
            if c[kind].syncs > stock[kind].syncs:
                failures.append(f"{name}: {c[kind].syncs} syncs per {what}, stock {stock[kind].syncs}: "
                                f"{c[kind].sync_ops()} against {stock[kind].sync_ops()}")
        ratio = c["decode"].total / reference["decode"].total
        if ratio > count_ops.ops_ratio(name):
            failures.append(f"{name}: {c['decode'].total} operators per decoding step, {ratio:.2f}× "
                            f"{count_ops.REFERENCE}'s {reference['decode'].total}")
    assert not failures, "\n".join(failures) + "\n" + count_ops.table(counts)


def test_the_console_script_counts_and_writes_the_operators(tmp_path):
    """fairseq-pe-count-ops (tests/fresh_subset.py runs it as a new interpreter, through its installed wrapper): the
    table, stock first, and the JSON of every operator."""
    proc = cli("fairseq-pe-count-ops", "--systems", "alibi", "--json", tmp_path / "counts.json")
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert rows == ["system", "stock", "alibi"]
    counts = json.loads((tmp_path / "counts.json").read_text())
    assert list(counts) == ["stock", "alibi"] and list(counts["alibi"]) == list(count_ops.KINDS)
    decode = counts["alibi"]["decode"]
    assert decode["total"] == sum(decode["ops"].values()) > 100
    assert decode["syncs"] <= counts["stock"]["decode"]["syncs"]


def test_the_counter_sees_a_sync():
    """The counter itself: ``.item()`` and ``bool()`` of a tensor are syncs, views are no kernels."""
    from fairseq_pe.diagnostics.op_count import counting

    x = torch.arange(6.0)
    with counting() as c:
        y = x.view(2, 3).t()
        bool(y.sum() > 0)
        x.max().item()
    assert c.syncs == 2 and c.views["view"] == 1 and c.views["t"] == 1 and c.kernels == c.total - 2


X = torch.arange(6.0) - 2
#: each call, and the syncs the counter must see in it (on the CPU, where the copies to the host cost nothing)
SYNCS = {
    "x[x > 0]": (lambda x: x[x > 0], {"index (mask)": 1}),
    "x.masked_select(x > 0)": (lambda x: x.masked_select(x > 0), {"masked_select": 1}),
    "x.nonzero()": (lambda x: x.nonzero(), {"nonzero": 1}),
    "torch.where(x > 0)": (lambda x: torch.where(x > 0), {"nonzero": 1}),
    "x[x > 0] = y": (lambda x: x.clone().__setitem__(x > 0, torch.ones(3)), {"index_put_ (mask)": 1}),
    "x.cpu()": (lambda x: x.cpu(), {"Tensor.cpu": 1}),
    "x.to('cpu')": (lambda x: x.to("cpu"), {"Tensor.to": 1}),
    "x.tolist()": (lambda x: x.tolist(), {"Tensor.tolist": 1}),
    "x.numpy()": (lambda x: x.numpy(), {"Tensor.numpy": 1}),
    "x[0].item()": (lambda x: x[0].item(), {"_local_scalar_dense": 1}),
    "int(x[1])": (lambda x: int(x[1]), {"_local_scalar_dense": 1}),
    "bool(x.any())": (lambda x: bool(x.any()), {"_local_scalar_dense": 1}),
    "torch.equal(x, x)": (lambda x: torch.equal(x, x), {"equal": 1}),
    # no syncs: indices that are not a mask, a mask applied without reading it, torch's masked_fill_ path of a
    # scalar assignment (on CUDA too), a move to the tensor's own device (no copy on a GPU either), views
    "x[indices]": (lambda x: x[torch.tensor([0, 2])], {}),
    "x.masked_fill(x > 0, 0)": (lambda x: x.masked_fill(x > 0, 0.0), {}),
    "x[x > 0] = 0": (lambda x: x.clone().__setitem__(x > 0, 0.0), {}),
    "x.to(x.device)": (lambda x: x.to(x.device), {}),
    "x.view(2, 3).t()": (lambda x: x.view(2, 3).t(), {}),
}


@pytest.mark.parametrize("call", list(SYNCS))
def test_the_counter_sees_each_kind_of_sync(call):
    from fairseq_pe.diagnostics.op_count import counting

    fn, expected = SYNCS[call]
    with counting() as c:
        fn(X)
    assert c.sync_ops() == expected and c.syncs == sum(expected.values())


def test_copies_of_device_tensors_to_the_host_are_syncs():
    """With tensors that are on a device (FakeTensorMode's CUDA tensors: their device without CUDA), the copies
    that reach torch's kernels are counted as such, once (not again as a host read)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fairseq_pe.diagnostics.op_count import counting

    with FakeTensorMode():
        y = torch.empty(4, device="cuda")
        with counting() as c:
            y.cpu()
            y.to("cpu")
            torch.empty(4).copy_(y)
            torch.ones(4).to(y.device)  # to the device: the host waits for a blocking copy too
            torch.ones(4).to(y.device, non_blocking=True)  # from pinned memory: no wait
            y.to(y.device)
    assert c.sync_ops() == {"_to_copy (to host)": 2, "copy_ (to host)": 1, "_to_copy (to device)": 1}


def test_counted_steps_take_the_cuda_branches():
    """Within the count, the counted model's attentions answer every capability as on CUDA and take CUDA's way (the
    ALiBi mask handed to SDPA laid out with rows aligned for the memory-efficient kernel); a model that is not
    counted keeps the CPU's answers in the same block (capabilities injected, not patched), and the counted one gets
    them back after it."""
    from fairseq_pe.diagnostics.attention_calls import recording
    from fairseq_pe.diagnostics.op_count import counting
    from fairseq_pe.models.attention import MASK_ALIGNMENT
    from fairseq_pe.models.capabilities import PREDICATES

    counted, d = build_model("--pe-relative", "alibi")
    other, _ = build_model("--pe-relative", "alibi")
    cpu = torch.device("cpu")

    def answers(model):
        return {getattr(model.encoder.layers[0].self_attn.capabilities, name)(cpu) for name in PREDICATES}

    def masks(model):
        src = random_tokens(d, 2, 7, left_pad=(0, 2))
        with torch.no_grad(), recording(model) as calls:
            model.encoder(src, torch.tensor([7, 5]))
        return [c for c in calls if c.mask_shape is not None]

    assert answers(counted) == {False}
    assert not all(c.mask_aligned(MASK_ALIGNMENT) for c in masks(counted))
    with counting(counted):
        assert answers(counted) == {True} and answers(other) == {False}
        inside = masks(counted)
        assert inside and all(c.mask_aligned(MASK_ALIGNMENT) for c in inside)
        assert not all(c.mask_aligned(MASK_ALIGNMENT) for c in masks(other))
    assert answers(counted) == {False}


def test_the_injected_capabilities_answer_every_predicate():
    """``PREDICATES`` names every public method of ``DeviceCapabilities`` (so a new device decision is taken as on
    CUDA in a count the day it is added), and ``AsOnCuda`` answers each."""
    from fairseq_pe.diagnostics.capabilities import AsOnCuda
    from fairseq_pe.models.capabilities import PREDICATES, DeviceCapabilities

    assert set(PREDICATES) == {n for n in vars(DeviceCapabilities) if not n.startswith("_")}
    cpu = torch.device("cpu")
    assert all(getattr(AsOnCuda(), name)(cpu) for name in PREDICATES)
    assert [getattr(AsOnCuda(only=["aligned_rows"]), name)(cpu) for name in PREDICATES] == [True] + [False] * (len(PREDICATES) - 1)
    with pytest.raises(ValueError, match="not a device predicate"):
        AsOnCuda(only=["flash"])


#: code of the package that branches on the device type outside the training and decoding steps, or that takes the
#: same operators on every device, and why (``path:function``)
DEVICE_BRANCHES_OUTSIDE_STEPS = {
    "fairseq_pe/models/attention.py:autocast_off": "autocast turned off on the tensor's own device type: no branch",
    "fairseq_pe/positional/floater.py:FloaterFlow._solve": "autocast turned off on the state's own device type",
    "fairseq_pe/compat/distributed_cpu.py:_torchrun_on_cpu.wrapper": "distributed set-up, before training",
    "fairseq_pe/compat/distributed_cpu.py:_ddp_on_cpu.wrapper": "building fairseq's DDP wrapper, before training",
    "fairseq_pe/compat/run_checks.py:check_run": "checking --ddp-backend, before training",
    "fairseq_pe/translation/bucket_loss.py:load_system": "a scoring script: where it puts the model",
    "fairseq_pe/translation/bucket_loss.py:score_references": "a scoring script: where it puts the batches",
    "fairseq_pe/bert/glue.py:evaluate": "an evaluation script: where it puts the model",
    "fairseq_pe/bert/squad.py:main": "an evaluation script: where it puts the model",
}


def device_branches(path):
    """(function, line) of each test of the device type in a Python file: ``.is_cuda``/``.is_cpu``, ``torch.cuda``,
    ``device_type=``, and comparisons of a ``device``/``.type`` or with "cuda"/"cpu"."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def function(node):
        names = []
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.append(node.name)
        return ".".join(reversed(names)) or "<module>"

    def names_a_device(node):
        return (isinstance(node, ast.Attribute) and node.attr in ("device", "type")) or (
            isinstance(node, ast.Constant) and node.value in ("cuda", "cpu"))

    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in ("is_cuda", "is_cpu")) or (
                isinstance(node, ast.Attribute) and node.attr == "cuda" and isinstance(node.value, ast.Name)
                and node.value.id == "torch") or (isinstance(node, ast.keyword) and node.arg == "device_type") or (
                isinstance(node, ast.Compare) and any(map(names_a_device, [node.left, *node.comparators]))):
            yield function(node), node.lineno


def test_every_branch_on_the_device_type_is_counted_as_on_cuda():
    """The count takes CUDA's branches through the attention's capabilities (``fairseq_pe/models/capabilities.py``):
    every other test of the device type in the package is outside the training and decoding steps
    (``DEVICE_BRANCHES_OUTSIDE_STEPS``), or in the instruments (``fairseq_pe/diagnostics/``) and the measurements
    (``fairseq_pe/benchmark/``), which no step calls.  A new one must be made one of these capabilities (or listed,
    with the reason)."""
    from fairseq_pe.models.capabilities import PREDICATES

    counted = {f"fairseq_pe/models/capabilities.py:DeviceCapabilities.{name}" for name in PREDICATES}
    found, unlisted = set(), []
    package = os.path.join(REPO, "fairseq_pe")
    for root, _, files in os.walk(package):
        for name in sorted(files):
            path = os.path.join(root, name)
            relative = os.path.relpath(path, REPO)
            if not name.endswith(".py") or relative.startswith(("fairseq_pe/diagnostics/", "fairseq_pe/benchmark/")):
                continue
            for function, line in device_branches(path):
                site = f"{relative}:{function}"
                found.add(site)
                if site not in counted and site not in DEVICE_BRANCHES_OUTSIDE_STEPS:
                    unlisted.append(f"{relative}:{line} (in {function})")
    assert not unlisted, "branches on the device type that the count does not take as on CUDA: " + ", ".join(unlisted)
    assert counted <= found, f"PREDICATES names capabilities that test no device type: {counted - found}"


def test_randomised_positions_add_no_sync_to_an_evaluation_pass():
    """In evaluation the encoder draws each sentence's positions from its tokens, on the device: its pass syncs as
    often as the same model's without randomised positions (issue 39: it copied the tokens to the host and hashed
    each sentence there, 2 + 2 per row)."""
    from fairseq_pe.diagnostics.op_count import counting
    from fairseq_pe.positional.injector import token_positions
    from fairseq_pe.positional.random_positions import sample_positions

    passes = {}
    for name, flags in (("plain", []), ("random", ["--pe-random-positions", "64"])):
        model, d = build_model("--pe-absolute", "sinusoidal", *flags)
        src = random_tokens(d, 4, 9, left_pad=(0, 2, 5, 0))
        with torch.no_grad(), recorded_passes(model.encoder.embed_positions) as built, counting(model) as passes[name]:
            model.encoder(src, torch.tensor([9, 7, 4, 9]))
    positions = built[-1].positions
    assert int(positions.max()) > 8  # the pass did draw (0 .. n−1 would stay below 9)
    assert passes["random"].sync_ops() == passes["plain"].sync_ops()
    with counting() as draw:
        sample_positions(token_positions(src, d.pad()), 64, src)
    assert draw.sync_ops() == {}
