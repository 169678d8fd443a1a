"""Weight transport: how a published policy version travels from the trainer to the
rollout replicas, behind one interface.

- ``WeightSender`` (the trainer's side, used by the ``weights`` actor): stages each
  published snapshot (host copies the trainer will not touch again) and answers the
  replicas' requests for its bytes.
- ``WeightReceiver`` (a replica's side, used by the rollout actor): ``fetch`` brings
  the newest staged version into tensors the engine can load.

Each has one implementation per transport, chosen once from ``[workflow]
weight_transport`` by ``build_sender`` / ``build_receiver``:

- ``nng`` (``nng.py``): the replica pulls chunks (``GetWeightChunk``) over the actor
  transport.
- ``local`` (``local.py``): a replica on the trainer's host maps the version the
  sender wrote once into shared memory (/dev/shm; on CUDA, a CUDA IPC handle of a
  buffer on the trainer's GPU) and loads it from there; a replica elsewhere fetches
  over nng (logged), the local sender being an nng sender too.
- ``collective`` (``collective.py``): the bytes are broadcast over a two-member
  torch.distributed group per replica (gloo/nccl/hccl by the replica's device);
  control (``StreamWeights``) stays on nng. Its sender also serves nng chunks, and its
  receiver falls back to nng for good when the trainer's side refuses the backend.

What stays outside the transport, in the actors: announcements (``WeightsReady``),
the swap grant (``AcquireSwap``/``ReleaseSwap``), the replica list, and version
integrity (the digest a version is published with, checked by the replica after it
loads the tensors a receiver returned).

How a version fans out to many replicas is ``[workflow] weight_fanout``: ``direct``
(each replica pulls it from the ``weights`` actor) or ``tree`` (``_relay.py``: replicas
relay the nng chunks to each other, each one's receiver a ``TreeReceiver`` with a relay
actor beside it; the ``weights`` actor names each replica's sources in its
announcement).

Future transports plug in here, as one sender and one receiver each plus a line in
the two factories: vLLM's NCCL weight-transfer engine (the weights actor as rank 0 of vLLM's group with
the replica's workers: the engine receives into its own parameters, so receiving is
loading, which suits partial rollout only), delta sync (only the tensors, or the
bytes, that changed since the replica's version). The vLLM engine's hop from the
replica process into its workers is not a transport: the engine does it in
``load_weights`` with vLLM's weight-transfer API over CUDA IPC (engines/vllm_rollout.py;
the ``collective`` transport puts the tensors on the replica's GPU for it).

Invariants every implementation keeps:
- A published version never changes; the two newest versions stay staged, so a
  replica mid-fetch of the older one can finish.
- A failed fetch raises within the configured ``weight_timeout_s`` on the replica's
  side and leaves nothing broken behind: the next ``fetch`` starts afresh.
"""

from __future__ import annotations

import logging

from asyncflow.actors.weights._base import WeightReceiver, WeightSender
from asyncflow.actors.weights._relay import relay_name, tree_levels, tree_sources
from asyncflow.actors.weights.nng import NngReceiver, NngSender

log = logging.getLogger(__name__)

__all__ = ["WeightReceiver", "WeightSender", "build_receiver", "build_sender", "relay_name", "tree_levels", "tree_sources"]


def build_sender(transport: str, ctx, chunk_bytes: int, timeout_s: float, run_dir: str = "", device: str = "cpu") -> WeightSender:
    """The trainer's side of ``transport`` (``[workflow] weight_transport``) for the
    actor of ``ctx``; ``timeout_s`` bounds each transfer step. ``local``: ``run_dir``
    names its files, ``device`` (``cluster.device``) says where it publishes (cuda:
    this process's current GPU, where it has one)."""
    if transport == "nng":
        return NngSender(chunk_bytes)
    if transport == "local":
        import torch

        from asyncflow.actors.weights.local import LocalSender

        on = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" and torch.cuda.is_available() else None
        return LocalSender(ctx.directory, chunk_bytes, run_dir or ctx.name, device=on)
    if transport == "collective":
        from asyncflow.actors.weights.collective import CollectiveSender  # torch.distributed: only where used

        return CollectiveSender(ctx.directory, ctx.transport, chunk_bytes, timeout_s)
    raise ValueError(f"unknown weight transport {transport!r}: use 'nng', 'local' or 'collective'")


def build_receiver(
    transport: str,
    ctx,
    timeout_s: float,
    device: str | None = None,
    engine=None,
    fanout: str = "direct",
    link_mb_s: float = 0.0,
) -> WeightReceiver:
    """A replica's side of ``transport`` for the actor of ``ctx``. The collective
    receives onto the engine's device (else ``device``); where this replica cannot
    take part in one (e.g. npu without torch_npu) it says so once and uses nng.
    ``fanout`` (``[workflow] weight_fanout``): ``tree`` relays nng chunks through the
    replicas (``_relay.py``; the config refuses it with the collective); ``link_mb_s``, an
    emulated uplink for this replica's relay (benchmarks, ``_link.py``)."""
    if fanout not in ("direct", "tree"):
        raise ValueError(f"unknown weight fan-out {fanout!r}: use 'direct' or 'tree'")
    if fanout == "tree":
        if transport != "nng":
            raise ValueError(f"weight_fanout = 'tree' relays nng chunks, not {transport!r}: use weight_transport = 'nng'")
        from asyncflow.actors.weights._relay import TreeReceiver

        return TreeReceiver(ctx, timeout_s, link_mb_s=link_mb_s)
    if transport == "nng":
        return NngReceiver(timeout_s)
    if transport not in ("local", "collective"):
        raise ValueError(f"unknown weight transport {transport!r}: use 'nng', 'local' or 'collective'")
    import torch

    from asyncflow.actors.weights.collective import CollectiveReceiver

    on = getattr(engine, "device", None)
    if not isinstance(on, torch.device):
        on = torch.device(device or "cpu")
    if transport == "local":
        from asyncflow.actors.weights.local import LocalReceiver

        return LocalReceiver(ctx.directory, ctx.name, on, timeout_s=timeout_s)
    try:
        return CollectiveReceiver(ctx.directory, ctx.transport, ctx.name, on, timeout_s=timeout_s)
    except (RuntimeError, ValueError) as exc:  # e.g. npu without torch_npu
        log.warning("%s: weight transport 'collective' unavailable on this replica (%s); using nng", ctx.name, exc)
        return NngReceiver(timeout_s)
