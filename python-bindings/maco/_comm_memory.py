"""The memory and plan calls of :class:`maco.Communicator` (registration, peers' buffers
mapped here, memory from ``maco_mem_alloc``, execution plans), kept apart from its collectives:
:class:`maco.Communicator` is made of both."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Sequence

from ._handles import Plan, Registration, _MappedPeer
from ._tensor import DLPackExport
from ._types import INT64_MAX, c_int, to_maco_dtype, to_numpy_dtype, to_torch_dtype


class _MemoryCalls:
    """Part of :class:`maco.Communicator` (see its text); uses its ``_c`` (the extension's
    communicator), ``_device``, ``rank``, ``_buf``, ``barrier`` and ``allgather_bytes``."""

    # ------------------------------------------------------------ plans

    def load_plan(self, plan: Any) -> "Plan":
        """Loads an execution plan for this communicator (``maco_plan_load``): ``plan`` is a
        plan file's path or a :class:`maco.language.Program`. Collective and blocking: every
        rank loads the same plan. The plan is verified first (postcondition, races,
        deadlocks, bounds).

        Returns: a :class:`Plan`; call it to run the collective.
        Raises: InvalidArgumentError with the verifier's first problem (rank, thread block,
        operation, chunk) or a world size other than this communicator's; UnsupportedError
        for what the executor cannot run here (the message says what); FileNotFoundError.
        """
        if hasattr(plan, "to_json"):
            text = plan.to_json()
            fd, path = tempfile.mkstemp(suffix=".json", prefix="maco-plan-")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                h = self._c.plan_load(path)
            finally:
                os.unlink(path)
        else:
            path = os.fspath(plan)
            with open(path) as f:
                text = f.read()
            h = self._c.plan_load(path)
        try:
            meta = json.loads(text)
        except ValueError:
            meta = {}
        return Plan(self, h, str(meta.get("collective", "allreduce")),
                    str(meta.get("name", os.path.basename(str(plan)))))

    # ------------------------------------------------------------ memory

    def register(self, tensor: Any) -> Registration:
        """Registers ``tensor``'s memory with this communicator, so collectives on it can run
        in place (see :class:`Registration`) once every rank registered its buffer and called
        :meth:`map_registrations`; until then they go through scratch, with the same results.
        Not collective, not blocking.

        Raises:
            InvalidArgumentError: memory CUDA does not know or of another device.
            UnsupportedError: no GPU, or cuMem memory not exportable by file descriptor.
        """
        b = self._buf(tensor, "tensor")
        if b.nbytes == 0:
            raise ValueError("tensor: has no elements to register")
        return Registration(self._c.register(b.address, b.nbytes), tensor)

    def map_registrations(self, barrier: bool = True) -> None:
        """Maps the registrations of this node's other ranks (:meth:`register`, :meth:`empty`)
        so that collectives on registered buffers run in place: a collective call never maps
        a peer's memory itself (``maco_collective_map_registrations``). With ``barrier``
        (the default) it first waits until every rank has called it, so every registration
        made before the call on any rank is mapped: collective then. With
        ``barrier=False`` it maps what the peers have registered so far: local.

        Blocking (mapping may fetch a file descriptor from a peer, bounded by
        MACO_BOOTSTRAP_TIMEOUT); enqueues no GPU work. Cheap when nothing is new.

        Raises:
            CommTimeoutError, RemoteError: the barrier or a peer did not answer (named).
            CudaError: a mapping failed (the registration stays unmapped, its calls use
                scratch, and the communicator stays usable).
        """
        if barrier:
            self.barrier()
        self._c.map_registrations()

    def peer_views(self, tensor: Any) -> list:
        """Every rank's ``tensor`` as a tensor of this process: element ``r`` is rank ``r``'s
        buffer mapped here (CUDA IPC over NVLink or PCIe; ``tensor`` itself at this rank's
        index), so that copies into or out of it (``view.copy_(x)``, cudaMemcpyAsync: the copy
        engines) and kernels reach the peer's memory directly.

        Collective and blocking (a bootstrap allgather of the handles): every rank passes a
        torch tensor of the same shape and dtype. The views keep the registration and the
        mappings alive; they must not be used after the owner frees its tensor. Ordering with
        the peer's work is the caller's (e.g. a collective used as a barrier on the stream).

        Args:
            tensor: a contiguous CUDA torch tensor on this communicator's device (memory from
                :meth:`empty` or torch's caching allocator).
        Returns: a list of ``size`` torch tensors, shape and dtype of ``tensor``.
        Raises:
            ValueError: no elements; shapes or dtypes differ between ranks (every rank raises).
            UnsupportedError: a peer on another node (no mapping), no GPU.
            CudaError: the mapping failed (no peer access between the GPUs).
        """
        import torch

        b = self._buf(tensor, "tensor")
        if b.nbytes == 0:
            raise ValueError("tensor: has no elements to map")
        # Compared by digest (any length), shown by its first 96 bytes.
        sig = f"{tuple(tensor.shape)}|{tensor.dtype}".encode()
        sigs = self.allgather_bytes(hashlib.sha256(sig).digest() + sig.ljust(96, b" ")[:96])
        if len({x[:32] for x in sigs}) != 1:
            bad = [r for r, x in enumerate(sigs) if x[:32] != sigs[self.rank][:32]]
            raise ValueError(f"tensor: rank {self.rank} has {sig.decode()}, rank {bad[0]} "
                             f"{sigs[bad[0]][32:].decode(errors='replace').strip()}: every "
                             "rank passes the same shape and dtype")
        mine = self._c.register(b.address, b.nbytes)
        handles = self.allgather_bytes(mine.serialize())
        views = []
        for r, h in enumerate(handles):
            if r == self.rank:
                views.append(tensor)
                continue
            mem = self._c.import_mem(h)
            holder = _MappedPeer(mem, mine, tensor)
            view = torch.as_tensor(holder, device=tensor.device)
            views.append(view.view(torch.bfloat16) if holder._bf16 else view)
        return views

    def empty(self, shape: Sequence[int] | int, dtype: Any, *, framework: str = "torch") -> Any:
        """A new uninitialised tensor in memory from ``maco_mem_alloc`` (registered with
        this communicator for as long as it lives; freed when the tensor is). Collectives use
        it in place once every rank has called :meth:`map_registrations` after allocating.

        Args:
            shape: dimensions.
            dtype: a MACO type, torch dtype, NumPy dtype or name.
            framework: "torch" or "cupy".

        Raises:
            ValueError: a negative dimension, or more than 2**63 - 1 bytes.
            UnsupportedError: no GPU. CudaError: the driver refused the allocation.
        """
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"shape: {shape} has a negative dimension")
        dt = to_maco_dtype(dtype)
        nbytes = dt.itemsize
        for s in shape:
            c_int(s, "shape", 0, INT64_MAX)
            nbytes *= s
        if nbytes > INT64_MAX:
            raise ValueError(f"shape: {shape} of {dt.name.lower()} is {nbytes} bytes; at most "
                             f"{INT64_MAX} (2**63 - 1) can be allocated")
        capsule = self._c.alloc_dlpack([nbytes], 1, 8)  # bytes; viewed as dt below
        export = DLPackExport(capsule, self._device if self._device is not None else 0)
        if framework == "torch":
            import torch

            raw = torch.from_dlpack(export)
            return raw.view(to_torch_dtype(dt)).reshape(shape)
        if framework == "cupy":
            import cupy

            raw = cupy.from_dlpack(export)
            return raw.view(to_numpy_dtype(dt)).reshape(shape)
        raise ValueError(f"framework: {framework!r} is not 'torch' or 'cupy'")
