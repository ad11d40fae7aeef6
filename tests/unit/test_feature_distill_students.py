"""``distill.students`` without processes: the plan that gives each image of a micro-batch to one rank of
the job (every image computed once, each rank's share within one of the others', and what every rank
sends is what its peers expect, in their rows' order), the layout of the students on the job's ranks,
each student's run config, and the one-line refusals — as the config loads, before any group exists."""

from __future__ import annotations

import pytest

from vitscale.config import ConfigError, load_config
from vitscale.errors import CheckError
from vitscale.tasks.feature_distill_students import (
    StudentLayout,
    check_student_runs,
    student_config,
    student_layout,
    teacher_plan,
)

TEACHER = "distill.teachers=[{name: t, path: t.safetensors}]"
BASE = ["digits_vit", "train.task=feature_distill", TEACHER, "train.batch_size=12", "train.output_dir=/tmp/job"]


def _exchange(layout: StudentLayout, m: int) -> dict[int, list[int]]:
    """The plan run by hand: each rank sends the positions it computed, as its plan says; returns the
    positions each rank ends with, in its received order."""
    plans = [teacher_plan(layout, m, j) for j in range(layout.world)]
    computed = {}
    for j, p in enumerate(plans):
        k, r = layout.place(j)
        g = len(layout.ranks[k])
        computed[j] = [row * g + r for row in p.rows]  # back to global positions
    out = {}
    for d, p in enumerate(plans):
        recv = []
        for j, q in enumerate(plans):
            start = sum(q.send_splits[:d])
            rows = q.send[start:start + q.send_splits[d]]
            assert len(rows) == p.recv_splits[j]  # what j sends is what d expects from j
            recv += [computed[j][i] for i in rows]
        out[d] = [recv[i] for i in p.order]
    return out


@pytest.mark.parametrize("ranks, m", [
    (((0,), (1, 2)), 12), (((0, 1), (2, 3)), 8), (((0,), (1,), (2, 3)), 8), (((0, 1, 2), (3,)), 6), (((0, 2), (1,)), 10),
])  # fmt: skip
def test_every_image_is_computed_once_and_reaches_each_of_its_holders(ranks, m):
    layout = StudentLayout(tuple(f"s{i}" for i in range(len(ranks))), ranks)
    plans = [teacher_plan(layout, m, j) for j in range(layout.world)]
    assert sum(plans[0].load) == m and max(plans[0].load) - min(plans[0].load) <= 1  # once each, balanced
    assert all(p.load == plans[0].load for p in plans)  # every rank agrees on the plan
    got = _exchange(layout, m)
    for j in range(layout.world):
        k, r = layout.place(j)
        assert got[j] == list(range(r, m, len(ranks[k])))  # the sampler's strided slice, in its order


def test_a_micro_batch_smaller_than_the_job_is_refused():
    with pytest.raises(Exception, match="too small for the job's 4 ranks"):
        teacher_plan(StudentLayout(("a", "b"), ((0, 1), (2, 3))), 2, 0)


def test_the_layout_of_the_students_on_the_job():
    cfg = load_config(*[BASE[0]], BASE[1:] + ["distill.students=[{name: a}, {name: b}]"])
    assert student_layout(cfg.distill.students, 4).ranks == ((0, 1), (2, 3))  # no ranks given: split evenly
    with pytest.raises(ConfigError, match="2 students do not split the job's 3 ranks evenly"):
        student_layout(cfg.distill.students, 3)
    with pytest.raises(ConfigError, match="do not split the job's 1 rank evenly"):
        student_layout(cfg.distill.students, 1)
    cfg = load_config(BASE[0], BASE[1:] + ["distill.students=[{name: a, ranks: [2]}, {name: b, ranks: [1, 0]}]"])
    assert student_layout(cfg.distill.students, 3).ranks == ((2,), (0, 1))
    with pytest.raises(ConfigError, match=r"rank 3 of the job's 4 belong to no student"):
        student_layout(cfg.distill.students, 4)
    with pytest.raises(ConfigError, match=r"distill.students\[a\].ranks=\[2\]: the job has 2 ranks \(0-1\), not rank 2"):
        student_layout(cfg.distill.students, 2)


@pytest.mark.parametrize("students, message", [
    ("[{name: a}, {name: a}]", "distill.students[1] and distill.students[0] are both named 'a'"),
    ("[{name: a, ranks: [0, 1]}, {name: b, ranks: [1]}]", "rank 1 is in student 'a' and in student 'b'"),
    ("[{name: a, ranks: [0]}, {name: b}]", "distill.students[b] lists no ranks while other students do"),
    ("[{name: a, ranks: [0, 0]}]", "distill.students[0]: ranks=[0, 0]: a rank is listed twice"),
    ("[{name: a, ranks: [-1]}]", "distill.students[0]: ranks[0]=-1 is out of range: use 0 to"),
    ("[{name: 2a}]", "distill.students[0]: name='2a'"),
    ("[{name: a, changes: {train.batch_size: 8}}]", "'train.batch_size' is the job's, not a student's"),
    ("[{name: a, changes: {data.img_size: 28}}]", "'data.img_size' is the job's"),
])  # fmt: skip
def test_bad_students_are_refused_as_the_config_loads(students, message):
    with pytest.raises(ConfigError) as e:
        load_config(BASE[0], BASE[1:] + [f"distill.students={students}"])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_each_students_run_config_is_the_jobs_with_its_model_and_changes():
    cfg = load_config(BASE[0], BASE[1:] + ["distill.students=[{name: a, overrides: {hidden_size: 48}, changes: {optim.lr: 1e-4}}, "
                                           "{name: b, model: vit_ti16, overrides: {img_h: 32, img_w: 32, patch_dim: 8}}]"])  # fmt: skip
    a, b = (student_config(cfg, s) for s in cfg.distill.students)
    assert a.train.output_dir == "/tmp/job/students/a" and b.train.output_dir == "/tmp/job/students/b"
    assert a.distill.students == [] and a.distill.teachers == cfg.distill.teachers
    assert a.model.name == "vit_debug" and a.model.overrides == {**cfg.model.overrides, "hidden_size": 48}
    assert a.optim.lr == 1e-4 and b.optim.lr == cfg.optim.lr and a.data == cfg.data
    assert b.model.name == "vit_ti16" and b.model.overrides == {"img_h": 32, "img_w": 32, "patch_dim": 8}
    layout = student_layout(cfg.distill.students, 2)
    assert check_student_runs([a, b], layout) == ["a (vit_debug, ranks 0)", "b (vit_ti16, ranks 1)"]
    c = student_config(cfg, type(cfg.distill.students[0])(name="c", model="vit_ti16"))  # its own 224 px
    with pytest.raises(ConfigError, match="student 'c' sees images of 3x224x224, student 'a' of 3x32x32"):
        check_student_runs([a, c], StudentLayout(("a", "c"), layout.ranks))
    with pytest.raises(CheckError, match=r"distill.students\[b\]: train.batch_size=12 must be divisible by data-parallel "
                                          "size 5"):  # fmt: skip
        check_student_runs([a, b], StudentLayout(("a", "b"), ((0,), (1, 2, 3, 4, 5))))
    streamed = load_config(BASE[0], BASE[1:] + ["data.format=webdataset", "data.webdataset_mode=stream", "data.train_path=s.tar",
                                                "distill.students=[{name: a}, {name: b}]"])  # fmt: skip
    runs = [student_config(streamed, s) for s in streamed.distill.students]
    assert len(check_student_runs(runs, StudentLayout(("a", "b"), ((0,), (1,))))) == 2  # as many ranks: the same streams
    with pytest.raises(ConfigError, match="data.webdataset_mode=stream: a stream's batches depend on the number of ranks"):
        check_student_runs(runs, StudentLayout(("a", "b"), ((0,), (1, 2))))
    with pytest.raises(ConfigError, match=r"distill.students\[b\]: model: "):
        student_config(cfg, type(cfg.distill.students[0])(name="b", overrides={"hidden_size": -3}))


def test_a_job_of_two_students_on_one_process_is_refused_before_anything_is_written(tmp_path, capsys):
    from vitscale.cli import main

    out = tmp_path / "job"
    rc = main(["train", *BASE, f"train.output_dir={out}", "distill.students=[{name: a}, {name: b}]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "2 students do not split the job's 1 rank evenly" in err[0], err
    assert not out.exists()
