"""Several students from one teacher forward, in one job (``distill.students`` of
``train.task=feature_distill``): DINOv3's multi-student distillation (facebookresearch/dinov3
``dinov3/train/multidist_meta_arch.py``, ``dinov3/configs/config.py`` ``setup_multidistillation``) on
vitscale's feature distillation. The method and the keys: docs/distillation.md, "Several students in
one job".

- **Ranks**: each student trains on its own ranks of the torchrun job (``distill.students[i].ranks``;
  DINOv3's ``ranks_range``). To the student's run those ranks are the whole world: this process's
  default process group is the student's (its FSDP2 mesh, its all-reduces, its checkpoint's ranks),
  ``RANK`` / ``WORLD_SIZE`` are its rank and size there, and it is an ordinary vitscale run
  (:func:`vitscale.train.train`) in ``<train.output_dir>/students/<name>/`` — its own optimizer,
  checkpoints, resume, metrics and export. A student that trains on one rank is a one-process run.
- **One teacher forward per batch**: every student reads the job's batches (its ranks split each global
  micro-batch as a run of that many ranks does: :class:`vitscale.data.sampler.ShardedBatchSampler`),
  so every image of a micro-batch is held by one rank of each student. :func:`teacher_plan` gives each
  image to one of its holders (the least loaded, then the lowest rank: each rank computes ``M / W`` of
  the ``M`` images, within one), that rank runs the teachers on it, and one ``all_to_all`` over the job
  (:class:`StudentExchange`) sends each image's features to its holder in every student. DINOv3 loads
  ``M / W`` images per rank, runs its teacher on them and all-gathers the outputs to every rank
  (``SSLMetaArch.broadcast_to_subgroups``, ``dinov3/train/ssl_meta_arch.py`` line 807); here the
  students' own loaders read their shares and each rank receives only the features of its own images.
- **Checks**: the students' runs are checked up front, on every rank, before any process group exists
  (their configs, layouts, and that they see images of one size); at every exchange the ranks compare
  their micro-step and batch shape (students resumed from checkpoints of different steps are refused,
  naming them), and each image's dataset index and a checksum of its pixels travel with its features,
  so a student whose batches are not the job's is stopped rather than taught another image's features.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vitscale.errors import ConfigError, UserError

from .distill import FiniteWatch, StepTimer
from .feature_distill_heads import TeacherFeatures


# ---------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class StudentLayout:
    """The students' names and the job ranks of each (ascending: a student's rank ``i`` is its
    ``ranks[i]``)."""

    names: tuple[str, ...]
    ranks: tuple[tuple[int, ...], ...]

    @property
    def world(self) -> int:
        return sum(len(r) for r in self.ranks)

    def place(self, job_rank: int) -> tuple[int, int]:
        """``(student, rank within the student)`` of job rank ``job_rank``."""
        for k, ranks in enumerate(self.ranks):
            if job_rank in ranks:
                return k, ranks.index(job_rank)
        raise ValueError(f"rank {job_rank} belongs to no student")


def student_layout(students, world: int) -> StudentLayout:
    """The layout of ``distill.students`` on a job of ``world`` ranks: the ranks each entry lists, or
    (none listed) the ranks split evenly in order. ConfigError (one line) unless every rank of the job
    belongs to exactly one student."""
    names = tuple(s.name for s in students)
    if not students:
        raise ConfigError("distill.students is empty")
    if not any(s.ranks for s in students):
        if world % len(students):
            raise ConfigError(f"distill.students: {len(students)} students do not split the job's {world} rank"
                              f"{'s' if world > 1 else ''} evenly: give each student its ranks (distill.students[i].ranks), "
                              f"or launch a multiple of {len(students)} processes (torchrun --nproc-per-node)")  # fmt: skip
        n = world // len(students)
        return StudentLayout(names, tuple(tuple(range(k * n, (k + 1) * n)) for k in range(len(students))))
    for s in students:
        far = [r for r in s.ranks if r >= world]
        if far:
            raise ConfigError(f"distill.students[{s.name}].ranks={s.ranks}: the job has {world} rank{'s' if world > 1 else ''} "
                              f"(0-{world - 1}), not rank {far[0]}: launch more processes (torchrun --nproc-per-node) or "
                              "list the job's own ranks")  # fmt: skip
    idle = sorted(set(range(world)) - {r for s in students for r in s.ranks})
    if idle:
        raise ConfigError(f"distill.students: rank{'s' if len(idle) > 1 else ''} {', '.join(map(str, idle))} of the job's {world} "
                          "belong to no student: give every rank to a student, or launch fewer processes")  # fmt: skip
    return StudentLayout(names, tuple(tuple(sorted(s.ranks)) for s in students))


@dataclass
class TeacherPlan:
    """Who computes which image of a global micro-batch of ``m`` images, for one rank (``me``).
    ``load``: images each job rank computes; ``rows``: this rank's, as rows of its own micro-batch;
    ``send``: rows of its computed images, grouped by the rank they go to (job rank order), with
    ``send_splits``; ``recv_splits``: rows it receives from each rank; ``order``: the received rows in
    the order of its own micro-batch."""

    load: list[int]
    rows: list[int]
    send: list[int]
    send_splits: list[int]
    recv_splits: list[int]
    order: list[int]


def teacher_plan(layout: StudentLayout, m: int, me: int) -> TeacherPlan:
    """Each image of a global micro-batch of ``m`` is computed once: position ``p`` is held by rank
    ``p mod g`` of each student of ``g`` ranks (the sampler's strided slice), as its row ``p // g``;
    of its holders the one with the fewest images so far computes it (ties: the lowest job rank).
    UserError when some rank would compute none (a micro-batch smaller than the job)."""
    sizes = [len(r) for r in layout.ranks]
    world = layout.world
    load = [0] * world
    owner = []
    for p in range(m):
        j = min((ranks[p % g] for ranks, g in zip(layout.ranks, sizes)), key=lambda h: (load[h], h))
        load[j] += 1
        owner.append(j)
    if min(load) == 0:
        raise UserError(f"distill.students: a global micro-batch of {m} images is too small for the job's {world} ranks to share "
                        "the teachers' forward (each rank computes at least one image): raise train.batch_size or lower "
                        "train.grad_accum")  # fmt: skip
    places = [layout.place(j) for j in range(world)]
    k, r = places[me]
    g = sizes[k]
    mine = [p for p in range(m) if owner[p] == me]
    send, send_splits = [], []
    for kd, rd in places:
        chosen = [i for i, p in enumerate(mine) if p % sizes[kd] == rd]
        send += chosen
        send_splits.append(len(chosen))
    held = list(range(r, m, g))  # this rank's micro-batch: row l is position l * g + r
    received, recv_splits = [], []
    for j in range(world):
        got = [p for p in held if owner[p] == j]
        received += got
        recv_splits.append(len(got))
    at = {p: i for i, p in enumerate(received)}
    return TeacherPlan(load, [p // g for p in mine], send, send_splits, recv_splits, [at[p] for p in held])


# ---------------------------------------------------------------------------------------------- configs
def student_config(cfg, student):
    """The run config of one student: the job's, with the student's model (``model`` and ``overrides``),
    its ``changes``, no ``students`` and ``<train.output_dir>/students/<name>`` as its folder — what
    training that student alone would be given. ConfigError naming the student for a bad value."""
    from vitscale.config.load import _merge, _set_dotted, config_from_dict, config_to_dict

    tree = config_to_dict(cfg)
    tree["distill"]["students"] = []
    if student.model:  # another variant: the job's overrides describe the job's model, not this one
        tree["model"] = {**tree["model"], "name": student.model, "overrides": dict(student.overrides)}
    else:
        tree["model"]["overrides"] = _merge(dict(tree["model"].get("overrides") or {}), dict(student.overrides))
    tree["train"]["output_dir"] = str(Path(cfg.train.output_dir) / "students" / student.name)
    for key, value in student.changes.items():
        _set_dotted(tree, key.split("."), value)
    try:
        return config_from_dict(tree)
    except ConfigError as e:
        raise ConfigError(f"distill.students[{student.name}]: {e}") from None


def check_student_runs(cfgs: list, layout: StudentLayout) -> list[str]:
    """The up-front checks of every student's run (:func:`vitscale.run.checks.check_run`, on its own
    number of ranks), run on every rank before any process group exists; one image size and channel
    count for all; streamed data only for students of one rank count. Returns a line per student (its
    model and ranks)."""
    from vitscale.distributed.parallel_dims import LayoutError, ParallelDims, resolve_device
    from vitscale.run.assemble import resolve_run_model
    from vitscale.run.checks import check_run

    seen: tuple[str, tuple] | None = None
    lines = []
    for name, scfg, ranks in zip(layout.names, cfgs, layout.ranks):
        pc = scfg.parallel
        try:
            dims = ParallelDims.from_sizes(pc.dp_replicate, pc.dp_shard, pc.tp, len(ranks), rank=0, local_rank=0,
                                           device=resolve_device(scfg.train.device, 0))  # fmt: skip
        except LayoutError as e:
            raise ConfigError(f"distill.students[{name}] (on {len(ranks)} rank{'s' if len(ranks) > 1 else ''}): {e}") from None
        if dims.tp > 1:
            raise ConfigError(f"distill.students with parallel.tp={dims.tp}: the students' ranks are data-parallel ranks "
                              "(each its share of the batch); tensor parallelism inside a student is not supported yet")  # fmt: skip
        resolved = resolve_run_model(scfg)
        try:
            check_run(scfg, dims, "train", resolved)
        except UserError as e:
            raise type(e)(f"distill.students[{name}]: {e}") from None
        px = scfg.data.img_size
        shape = (resolved.cfg.num_channels, *((px, px) if px else (resolved.cfg.img_h, resolved.cfg.img_w)))
        if seen is not None and shape != seen[1]:
            raise ConfigError(f"distill.students: student {name!r} sees images of {'x'.join(map(str, shape))}, student {seen[0]!r} "
                              f"of {'x'.join(map(str, seen[1]))}: the students share the teachers' features of each image, so they "
                              "see the same images — give them one image size (data.img_size, or the models' img_size)")  # fmt: skip
        seen = seen or (name, shape)
        lines.append(f"{name} ({scfg.model.name}, ranks {','.join(map(str, ranks))})")
    d = cfgs[0].data
    streamed = next((f"{k}=stream" for k in ("webdataset_mode", "parquet_mode") if getattr(d, k, None) == "stream"), None)
    if streamed and len({len(r) for r in layout.ranks}) > 1:
        raise ConfigError(f"distill.students with data.{streamed}: a stream's batches depend on the number of ranks "
                          "(vitscale/data/stream.py), so students on different numbers of ranks would read different images; "
                          f"give every student as many ranks (now {', '.join(f'{n}: {len(r)}' for n, r in zip(layout.names, layout.ranks))}) "
                          "or index the data (the default mode)")  # fmt: skip
    return lines


# ---------------------------------------------------------------------------------------------- exchange
class StudentExchange:
    """The teachers' features of this rank's micro-batch, computed once over the job
    (:func:`teacher_plan`) and sent to their holders: ``ctrl`` (gloo, the host's tensors) agrees on
    each exchange's micro-step and batch shape; ``data`` (gloo on CPU, NCCL on CUDA) carries the
    features."""

    def __init__(self, layout: StudentLayout, rank: int, ctrl, data, device: torch.device, grad_accum: int = 1,
                 stop_group=None):  # fmt: skip
        self.layout, self.rank, self.ctrl, self.data = layout, rank, ctrl, data
        # the job's ranks agree on a signal's stop (vitscale.train.preemption), so every student stops after the
        # same step: its own group, as the exchange's groups carry the steps' traffic
        self.stop_group = stop_group
        self.device, self.accum = torch.device(device), grad_accum
        self.student, self.student_rank = layout.place(rank)
        self.size = len(layout.ranks[self.student])
        self.plans: dict[int, tuple[TeacherPlan, dict[str, torch.Tensor]]] = {}
        self.weights: dict[tuple[int, ...], torch.Tensor] = {}
        self.watch = FiniteWatch(device)  # a later exchange's agreement: read one call late
        self.timer = StepTimer(self.device)  # the exchanges' time (waiting for the job's other ranks included)
        self.calls = 0

    def plan(self, m: int) -> tuple[TeacherPlan, dict[str, torch.Tensor]]:
        if m not in self.plans:
            p = teacher_plan(self.layout, m, self.rank)
            index = {k: torch.tensor(getattr(p, k), dtype=torch.long, device=self.device) for k in ("rows", "send", "order")}
            self.plans[m] = (p, index)
        return self.plans[m]

    def _checksum(self, images: torch.Tensor) -> torch.Tensor:
        """One number per image: its pixels against fixed random weights (a flip or another crop changes it)."""
        shape = tuple(images.shape[1:])
        if shape not in self.weights:
            g = torch.Generator().manual_seed(48)
            self.weights[shape] = torch.randn(images[0].numel(), generator=g).to(self.device)
        return images.flatten(1).float() @ self.weights[shape]

    def _agree(self, micro_step: int, images: torch.Tensor) -> int:
        """Every rank's micro-step and micro-batch shape, compared on the host (each rank's own numbers);
        returns the global micro-batch."""
        m = images.shape[0] * self.size
        head = torch.tensor([micro_step, m, *images.shape[1:]], dtype=torch.int64)
        heads = [torch.empty_like(head) for _ in range(self.layout.world)]
        self.ctrl.allgather([heads], [head]).wait()
        if all(torch.equal(h, heads[0]) for h in heads):
            return m
        first = {name: heads[ranks[0]].tolist() for name, ranks in zip(self.layout.names, self.layout.ranks)}
        if len({h[0] for h in first.values()}) > 1:
            at = ", ".join(f"{n}: step {h[0] // self.accum + 1}" for n, h in first.items())
            raise UserError(f"distill.students: the students are at different steps ({at}): their runs resumed from "
                            "checkpoints of different steps; remove the newer checkpoints (students/<name>/checkpoints/"
                            "step_*) so that every student starts from the same step")  # fmt: skip
        at = ", ".join(f"{n}: {h[1]} images of {'x'.join(map(str, h[2:]))}" for n, h in first.items())
        raise UserError(f"distill.students: the students' micro-batches differ ({at}): every student reads the job's "
                        "batches (data.*, train.batch_size, train.grad_accum, the image size)")  # fmt: skip

    def features(self, images: torch.Tensor, index: torch.Tensor | None, micro_step: int,
                 compute) -> dict[str, TeacherFeatures]:  # fmt: skip
        """The teachers' features of ``images`` (this rank's micro-batch; ``index``: their dataset indices,
        or None): ``compute(x)`` (every teacher's :class:`TeacherFeatures` of images ``x``) runs on this
        rank's share of the global micro-batch only, the rest comes from the ranks that computed it."""
        step = micro_step // self.accum + 1
        failed = self.watch.failed_step()
        if failed is not None:
            raise UserError(self._mismatch(failed))
        with self.timer():
            m = self._agree(micro_step, images)
        plan, ix = self.plan(m)
        n = images.shape[0]
        x = images.index_select(0, ix["rows"])
        computed = compute(x)
        own = torch.full((n,), -1, dtype=torch.int64, device=self.device)
        if index is not None:
            own = index.to(self.device, torch.int64, non_blocking=True).reshape(n)
        parts, spec = [], []
        for name, f in computed.items():
            for kind, t in (("summary", f.summary), ("patches", f.patches)):
                if t is not None:
                    parts.append(t.float().reshape(t.shape[0], -1))
                    spec.append((name, kind, tuple(t.shape[1:])))
        sent_index = own.index_select(0, ix["rows"]).view(torch.float32).reshape(-1, 2)  # the int64's bits, as 2 floats
        payload = torch.cat([*parts, self._checksum(x)[:, None], sent_index], dim=1)
        send = payload.index_select(0, ix["send"]).contiguous()
        recv = payload.new_empty((n, payload.shape[1]))
        with self.timer():
            self.data.alltoall_base(recv, send, plan.recv_splits, plan.send_splits, dist.AllToAllOptions()).wait()
        recv = recv.index_select(0, ix["order"])
        got_index = recv[:, -2:].contiguous().view(torch.int64).reshape(n)
        ok = torch.isclose(recv[:, -3], self._checksum(images), rtol=1e-4, atol=1e-3).all()
        ok = ok & ((got_index == own) | (own < 0) | (got_index < 0)).all()
        self.calls += 1
        if self.calls == 1 or self.device.type != "cuda":
            if not bool(ok):  # the host reads it at once where that costs no wait for a device
                raise UserError(self._mismatch(step))
        else:
            self.watch.record(ok, step)
        out: dict[str, dict[str, Any]] = {name: {"summary": None, "patches": None} for name in computed}
        col = 0
        for name, kind, shape in spec:
            width = int(torch.Size(shape).numel())
            out[name][kind] = recv[:, col:col + width].reshape(n, *shape)
            col += width
        return {name: TeacherFeatures(v["summary"], v["patches"], computed[name].grid) for name, v in out.items()}

    def _mismatch(self, step: int) -> str:
        return (f"distill.students: at step {step} the students' batches were not the same images (dataset index or pixels "
                "of one position differ between students): every student must read the job's data — the same data.*, "
                "image size, train.batch_size, train.grad_accum and train.seed; the run stopped")  # fmt: skip

    def finish(self) -> None:
        """Wait for every rank of the job (all students done) before the groups go."""
        self.ctrl.barrier().wait()


def _backend_shutdown(*pgs) -> None:
    for pg in pgs:
        with contextlib.suppress(Exception):
            pg.shutdown()


@contextlib.contextmanager
def student_process(layout: StudentLayout, rank: int, scfg, timeout_s: float, grad_accum: int):
    """This process as rank ``rank`` of the job and its student's rank: the job's groups (over
    torchrun's store), the student's default process group (more than one rank) and environment
    (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` of the student; ``LOCAL_RANK`` kept: the device),
    and the job's exchange (handed to the student's run as its task's ``runtime``); all undone on the way out."""
    from torch.distributed.rendezvous import rendezvous

    from vitscale.distributed.parallel_dims import resolve_device

    timeout = datetime.timedelta(seconds=timeout_s)
    k, r = layout.place(rank)
    name, size = layout.names[k], len(layout.ranks[k])
    device = resolve_device(scfg.train.device, int(os.environ.get("LOCAL_RANK", 0)))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store, _, _ = next(rendezvous("env://", timeout=timeout))  # torchrun's store (its agent's, or rank 0's)
    # The store outlives a job (torchrun's agent keeps it across restarts; rank 0's is shared by every client
    # in the process): each job's keys under a prefix of their own, the jobs counted per restart. Every rank
    # adds once before the job's groups connect, so all of one job's adds come before any of the next's.
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"vitscale/students/{restart}/{(store.add(f'vitscale/students/{restart}/jobs', 1) - 1) // layout.world}/"
    ctrl = dist.ProcessGroupGloo(dist.PrefixStore(prefix + "job/", store), rank, layout.world, timeout)
    stop = dist.ProcessGroupGloo(dist.PrefixStore(prefix + "job-stop/", store), rank, layout.world, timeout)
    data = ctrl
    if device.type == "cuda":
        data = dist.ProcessGroupNCCL(dist.PrefixStore(prefix + "job-nccl/", store), rank, layout.world, timeout)
    node = torch.tensor([int(os.environ.get("GROUP_RANK", "0") or 0)])  # torchrun's node rank
    nodes = [torch.empty_like(node) for _ in range(layout.world)]
    ctrl.allgather([nodes], [node]).wait()
    local_world = sum(int(nodes[j]) == int(node) for j in layout.ranks[k])
    saved = {key: os.environ.get(key) for key in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    os.environ.update(RANK=str(r), WORLD_SIZE=str(size), LOCAL_WORLD_SIZE=str(local_world))
    try:
        if size > 1:  # the student's ranks: its run's world
            kw = {"device_id": device} if device.type == "cuda" else {}
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout, rank=r, world_size=size,
                                    store=dist.PrefixStore(f"{prefix}{name}/", store), **kw)  # fmt: skip
        yield StudentExchange(layout, rank, ctrl, data, device, grad_accum, stop)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _backend_shutdown(*({id(data): data, id(ctrl): ctrl, id(stop): stop}.values()))
        del store, ctrl, data, stop
        gc.collect()  # the store's server (rank 0's, without torchrun's agent) freed with it: a next job may rendezvous


# ---------------------------------------------------------------------------------------------- the job
def train_students(cfg, train, *, summary: str = "human", notes=()) -> dict[str, Any]:
    """Train this rank's student of ``distill.students`` (every rank of the torchrun job runs this):
    the layout and every student's run checked, the groups made, then the student's own run (``train``:
    :func:`vitscale.train.train`, which hands itself over) in ``<train.output_dir>/students/<name>/``.
    Returns its summary."""
    from vitscale.config.load import save_config

    if dist.is_available() and dist.is_initialized():
        raise UserError("distill.students: this process is in a process group already; a job of several students makes its "
                        "own (launch it with torchrun, as its own command)")  # fmt: skip
    rank, world = int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)
    students = cfg.distill.students
    layout = student_layout(students, world)
    cfgs = [student_config(cfg, s) for s in students]
    described = check_student_runs(cfgs, layout)  # every rank checks every student: all refuse alike
    k, _ = layout.place(rank)
    m = cfg.train.batch_size // cfg.train.grad_accum
    share = teacher_plan(layout, m, rank).load[rank]  # a micro-batch too small to share: refused here, on every rank
    lines = [*notes, f"distill.students: this run is student {layout.names[k]!r} of {len(students)} in one job of {world} "
                     f"rank{'s' if world > 1 else ''}: {'; '.join(described)}; each image's teacher forward runs once in the "
                     f"job (this rank: {share} of every {m} images) and its features are sent to every student"]  # fmt: skip
    if world == 1:  # one student on one process: its run alone
        return train(cfgs[k], summary=summary, notes=lines)
    with student_process(layout, rank, cfgs[k], cfg.parallel.timeout, cfg.train.grad_accum) as exchange:
        if rank == 0:  # the job's own config: `torchrun ... -m vitscale train <output_dir>/students.yaml` resumes it
            save_config(cfg, Path(cfg.train.output_dir) / "students.yaml")
        result = train(cfgs[k], summary=summary, notes=lines, runtime=exchange)  # the task's runtime: the exchange
        exchange.finish()
    return result


__all__ = ["StudentExchange", "StudentLayout", "TeacherPlan", "check_student_runs", "student_config",
           "student_layout", "student_process", "teacher_plan", "train_students"]
