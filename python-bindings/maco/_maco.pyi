"""MACO's C API for the maco package (internal: use maco's Python API)."""

from collections.abc import Sequence
from typing import Optional


UNIQUE_ID_BYTES: int = 128

DATATYPE_COUNT: int = 12

REDOP_COUNT: int = 5

def version() -> str:
    """The C library's version, "MAJOR.MINOR.PATCH"."""

def status_string(status: int) -> str:
    """The constant text of a status code."""

def datatype_size(datatype: int) -> int:
    """Bytes per element of a MACO datatype (0 if unknown)."""

def datatype_name(datatype: int) -> str:
    """Name of a MACO datatype ("unknown" if out of range)."""

def redop_name(op: int) -> str:
    """Name of a MACO reduction ("unknown" if out of range)."""

def cuda_device_count() -> tuple[int, str]:
    """(number of usable CUDA devices, why there are none or "")."""

def plan_verify_file(path: str) -> tuple[int, str]:
    """(status, report) of MACO's plan verifier on a plan file: (0, "") when valid."""

def fused_scratch_bytes(kind: int, nranks: int, m: int, n: int, k: int, out_type: int) -> int:
    """Bytes of scratch a fused operator needs on every rank: maco_fused_gemm_scratch_bytes."""

def fused_scratch_bytes_mode(kind: int, mode: int, nranks: int, m: int, n: int, k: int,
                             out_type: int) -> int:
    """Bytes of scratch a fused operator needs on every rank in communication mode `mode`:
    maco_fused_gemm_scratch_bytes_mode."""

def fused_choose_comm(kind: int, nranks: int, m: int, n: int, k: int, out_type: int) -> int:
    """The communication mode (maco_fused_comm_t: 0 SM, 1 copy engines) that
    MACO_FUSED_COMM_AUTO takes for a fused operator: maco_fused_gemm_choose_comm."""

def plan_gemm_tiles(m: int, n: int, workers: int) -> list[tuple[int, int, int]]:
    """[(tile_row, tile_col, tile_n), ...] in the order to add them: maco_gemm_plan_tiles."""

def mem_copy_batch(dst: list[int], src: list[int], bytes: list[int], stream: int) -> None:
    """
    cudaMemcpyAsync of bytes[i] from src[i] to dst[i] (addresses), in order, on stream (a
    cudaStream_t): maco_mem_copy_batch.
    """

def unique_id() -> bytes:
    """
    A new 128-byte unique id; rank 0 of the job must be created in this process.
    """

def unique_id_from_env() -> tuple[bytes, int, int]:
    """
    (unique id, rank, size) of the job the environment describes (launcher detection and the id through the launcher's store: maco_unique_id_from_env); collective, blocking, releases the GIL.
    """

def group_start() -> None:
    """Opens a group on this thread (maco_group_start)."""

def group_end() -> None:
    """Closes the group and issues it (maco_group_end); releases the GIL."""

def dlpack_describe(capsule: object) -> tuple:
    """
    (address, shape, strides|None, code, bits, lanes, device_type, device_id, readonly) of an unconsumed DLPack capsule. ValueError when its ndim is outside 0..64, its shape is NULL, a dimension is negative or data + byte_offset passes 2**64.
    """

def config() -> list:
    """
    The configuration table: (name, type, default, unit, doc) for each MACO_* variable.
    """

class PKernel:
    """A task graph, its fused operators' channels and the persistent kernel made from it
    (maco/persistent.h)."""

    def add_task(self, task: dict) -> int:
        """maco_task_graph_add_task from a dict of maco_task_t's fields; returns the id."""

    def add_dependency(self, task: int, depends_on: int) -> None: ...

    def ntasks(self) -> int:
        """Tasks in the graph so far (before compile)."""

    def setup_channels(self, scratch: int, bytes: int) -> list[int]:
        """Registers scratch, imports every peer's, makes a memory channel to each
        (collective); the graph's channel index per rank (-1: this rank)."""

    def setup_port_channels(self, src: int, src_bytes: int, dst: int, dst_bytes: int
                            ) -> list[int]:
        """Registers src and dst, imports every peer's dst, makes a port channel from src
        into each (collective; this kernel's proxy); the graph's port channel index per rank
        (-1: this rank)."""

    def add_fused(self, kind: int, mode: int, channels: Sequence[int],
                  out_channels: Sequence[int], ports: Sequence[int], out_ports: Sequence[int],
                  a: int, b: int, out: int, scratch: int, m: int, n: int, k: int,
                  out_type: int, name: str) -> int:
        """maco_task_graph_add_gemm_allreduce (kind 0), _gemm_reduce_scatter (1) or
        _allgather_gemm (2) in communication mode `mode` (maco_fused_comm_t); empty channel
        lists pass NULL; returns the id of the operator's last task."""

    def compile(self, workers: int, schedulers: int, comm_workers: int, threads: int,
                profile: bool) -> None:
        """maco_persistent_kernel_create (validates and uploads; blocking)."""

    def launch(self, stream: int) -> None: ...

    def config(self) -> dict: ...

    def profile(self, ntasks: int) -> list[list[int]]: ...

    def write_trace(self, path: str) -> None: ...

    def summary(self) -> str: ...

    def close(self) -> None: ...

class Plan:
    """An execution plan loaded for a communicator (maco_plan_t)."""

    def execute(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                stream: int) -> None:
        """maco_plan_execute: one launch on `stream`."""

    def destroy(self) -> None:
        """maco_plan_destroy (waits for the device); idempotent."""

    @property
    def destroyed(self) -> bool: ...

class Mem:
    """A registration of a buffer with a communicator (maco_mem_t)."""

    @property
    def address(self) -> int: ...

    @property
    def bytes(self) -> int: ...

    @property
    def registered(self) -> bool: ...

    def serialize(self) -> bytes:
        """The registration's handle (MACO_MEM_HANDLE_BYTES bytes) for a peer's import."""

    def deregister(self) -> None:
        """Ends the registration; idempotent."""

class Comm:
    """A MACO communicator handle (maco_comm_t) and what owns it."""

    @staticmethod
    def from_unique_id(unique_id: bytes, rank: int, size: int, device: int = -1, timeout_ms: int = -1) -> Comm:
        """Joins the job of `unique_id` and creates a communicator (collective)."""

    @staticmethod
    def from_env(device: int = -1) -> Comm:
        """Creates a communicator from MACO_* or torchrun variables (collective)."""

    def close(self) -> None:
        """Drops this handle's reference to the communicator."""

    @property
    def closed(self) -> bool: ...

    @property
    def handle(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def local_rank(self) -> int: ...

    @property
    def local_size(self) -> int: ...

    @property
    def node(self) -> int: ...

    @property
    def num_nodes(self) -> int: ...

    @property
    def device(self) -> int: ...

    @property
    def gpu_ranks(self) -> int: ...

    @property
    def last_error(self) -> str: ...

    def async_error(self) -> int:
        """The first asynchronous failure's status (0 when none)."""

    def host_id(self, rank: int) -> str: ...

    def bootstrap_barrier(self) -> None:
        """Host barrier over the bootstrap's TCP mesh (collective, blocking)."""

    def bootstrap_allgather(self, data: bytes) -> list:
        """Gathers equally sized bytes from every rank (collective)."""

    def bootstrap_broadcast(self, data: bytes, root: int) -> bytes:
        """Root's bytes to every rank (collective)."""

    def revoke(self) -> None:
        """maco_comm_revoke: ends this rank's and the peers' waits (thread-safe)."""

    def shrink(self, exclude: Sequence[int], abort: bool) -> Optional[Comm]:
        """maco_comm_shrink: the live, non-excluded ranks' communicator, or None."""

    def split(self, color: int, key: int) -> Optional[Comm]:
        """maco_comm_split: this color's communicator, or None."""

    def grow_id(self) -> bytes:
        """maco_comm_get_grow_id (rank 0): the id new ranks join with."""

    def grow(self, nranks: int, grow_id: Optional[bytes]) -> Optional[Comm]:
        """maco_comm_grow: the grown communicator (existing ranks)."""

    @staticmethod
    def join(grow_id: bytes, rank: int, nranks: int, device: int = -1) -> Optional[Comm]:
        """maco_comm_join: a new rank's side of a grow."""

    def allreduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int) -> None: ...

    def allgather(self, sendbuf: int, recvbuf: int, sendcount: int, datatype: int, stream: int) -> None: ...

    def reduce_scatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int, op: int, stream: int) -> None: ...

    def broadcast(self, sendbuf: int, recvbuf: int, count: int, datatype: int, root: int, stream: int) -> None: ...

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, root: int, stream: int) -> None: ...

    def alltoall(self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int) -> None: ...

    def alltoallv(self, sendbuf: int, sendcounts: Sequence[int], sdispls: Sequence[int], recvbuf: int, recvcounts: Sequence[int], rdispls: Sequence[int], datatype: int, stream: int) -> None: ...

    def send(self, buf: int, count: int, datatype: int, peer: int, stream: int) -> None: ...

    def recv(self, buf: int, count: int, datatype: int, peer: int, stream: int) -> None: ...

    def register(self, address: int, bytes: int) -> Mem: ...

    def map_registrations(self) -> None:
        """Maps the local peers' new registrations (maco_collective_map_registrations)."""

    def import_mem(self, handle: bytes) -> Mem:
        """Maps a local peer's registration (maco_mem_import); deregister() unmaps it."""

    def persistent_kernel(self) -> PKernel:
        """A new, empty PKernel on this communicator."""

    def plan_load(self, path: str) -> Plan:
        """maco_plan_load: reads, verifies and sets up a plan file (collective, blocking)."""

    def alloc_dlpack(self, shape: Sequence[int], code: int, bits: int) -> object:
        """
        maco_mem_alloc memory as an unconsumed DLPack capsule (freed by its consumer).
        """

    def algorithm(self, collective: int, count: int, datatype: int) -> str: ...

    def set_algorithm(self, collective: int, name: str | None) -> None: ...

    def set_max_ctas(self, max_ctas: int) -> None:
        """maco_collective_set_max_ctas (collective, blocking)."""

    def max_ctas(self) -> tuple[int, int]:
        """
        (cap set by set_max_ctas or 0, co-resident CTAs of a kernel that waits on peers).
        """

    def last_ctas(self) -> int:
        """
        CTAs of the last collective kernel launched (0: none yet); does not wait for the device.
        """

    def stats(self) -> tuple[int, int, int]:
        """
        (in-place launches, scratch launches) of the mesh kernels and the CTAs of the last collective kernel; synchronises the device.
        """

# ---- expert parallelism (maco/ep.h; src/ep.cpp)

class EpBuffer:
    """An expert-parallel buffer (maco_ep_buffer_t, maco/ep.h); maco.ep.Buffer builds on it."""

    def info(self) -> dict:
        """maco_ep_buffer_get_info as a dict."""

    def dispatch(self, x: int, x_dtype: int, num_tokens: int, hidden: int, topk_idx: int,
                 topk_weights: int, topk: int, recv_counts: int, recv_offsets: int,
                 recv_topk_weights: int, handle: int, want_num_recv: bool, stream: int,
                 use_fp8: bool = False) -> int:
        """
        maco_ep_dispatch, or maco_ep_dispatch_fp8 with use_fp8 (addresses as ints, 0 for NULL); the rows received when want_num_recv (normal mode: waits), else -1. Releases the GIL.
        """

    def combine(self, expert_out: int, dtype: int, hidden: int, handle: int, topk_weights: int,
                num_tokens: int, topk: int, y: int, stream: int) -> None:
        """maco_ep_combine."""

    def check(self) -> None:
        """maco_ep_buffer_check: raises the device-found input error not reported yet."""

    def destroy(self) -> None:
        """maco_ep_buffer_destroy (waits for the device); idempotent."""

    @property
    def destroyed(self) -> bool: ...

def ep_buffer_create(comm: Comm, mode: int, max_tokens_per_rank: int, hidden: int,
                     num_experts: int, topk: int, dtype: int, max_recv_tokens: int,
                     num_ctas: int) -> EpBuffer:
    """maco_ep_buffer_create (collective, blocking): an EpBuffer on `comm`."""
