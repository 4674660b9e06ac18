"""IF, WHILE, CALL_ONCE and resource variables (VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE) on the
CPU backend, against LiteRT, on builder-made multi-subgraph models."""

import numpy as np
import pytest

from delegate.config import load_config
from delegate.interpreter import Interpreter
from delegate.tflite.builder import GraphBuilder, build_model
from tests.oputil import litert

ENGINES = ["numpy", "litert"]
NONE = {"fused_activation_function": "NONE"}


def ours(model: bytes, engine: str) -> Interpreter:
    it = Interpreter(model_content=model, config=load_config("configs/cpu.yaml", overrides=[f"cpu.engine={engine}"]))
    it.allocate_tensors()
    return it


def theirs(model: bytes):
    it = litert.Interpreter(model_content=model)
    it.allocate_tensors()
    return it


def invoke(it, *values):
    for d, v in zip(it.get_input_details(), values):
        it.set_tensor(d["index"], v)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def if_model() -> bytes:
    """y = x * 2 when cond, else x - 1 (then/else are subgraphs 1 and 2)."""
    main = GraphBuilder("main")
    cond, x = main.input("cond", (1,), "bool"), main.input("x", (2, 3))
    main.output(main.op("IF", [cond, x], options={"then_subgraph_index": 1, "else_subgraph_index": 2},
                        dtype="float32", shape=(2, 3), name="y"))
    branches = []
    for name, opcode, k in (("then", "MUL", 2.0), ("else", "SUB", 1.0)):
        b = GraphBuilder(name)
        v = b.input("v", (2, 3))
        b.output(b.op(opcode, [v, b.const("k", np.float32(k))], options=NONE, name="out"))
        branches.append(b)
    return build_model(main, *branches)


def while_model() -> bytes:
    """(i, acc) -> while i < n: (i + 1, acc * 1.5 + 1)."""
    main = GraphBuilder("main")
    i, acc, n = main.input("i", (), "int32"), main.input("acc", (2,)), main.input("n", (), "int32")
    outs = main.op("WHILE", [i, acc, n], options={"cond_subgraph_index": 1, "body_subgraph_index": 2},
                   outputs=[main.tensor("i_out", (), "int32"), main.tensor("acc_out", (2,)),
                            main.tensor("n_out", (), "int32")])
    main.output(outs[0], outs[1])
    cond = GraphBuilder("cond")
    ci, _, cn = cond.input("i", (), "int32"), cond.input("acc", (2,)), cond.input("n", (), "int32")
    cond.output(cond.op("LESS", [ci, cn], dtype="bool", shape=(), name="more"))
    body = GraphBuilder("body")
    bi, bacc, bn = body.input("i", (), "int32"), body.input("acc", (2,)), body.input("n", (), "int32")
    next_i = body.op("ADD", [bi, body.const("one", np.int32(1))], options=NONE, name="next_i")
    scaled = body.op("MUL", [bacc, body.const("k", np.float32(1.5))], options=NONE, name="scaled")
    next_acc = body.op("ADD", [scaled, body.const("b", np.float32(1.0))], options=NONE, name="next_acc")
    body.output(next_i, next_acc, bn)
    return build_model(main, cond, body)


def counter_model() -> bytes:
    """A resource variable set to 10 by CALL_ONCE's initialiser; each run adds x to it and returns it."""
    main = GraphBuilder("main")
    x = main.input("x", (1,))
    main.op("CALL_ONCE", [], options={"init_subgraph_index": 1}, outputs=[])
    handle = main.op("VAR_HANDLE", [], options={"shared_name": "total"}, dtype="resource", shape=(), name="h")
    value = main.op("READ_VARIABLE", [handle], dtype="float32", shape=(1,), name="value")
    total = main.op("ADD", [value, x], options=NONE, name="sum")
    main.op("ASSIGN_VARIABLE", [handle, total], outputs=[])
    main.output(total)
    init = GraphBuilder("init")
    h = init.op("VAR_HANDLE", [], options={"shared_name": "total"}, dtype="resource", shape=(), name="h")
    init.op("ASSIGN_VARIABLE", [h, init.const("ten", np.array([10.0], np.float32))], outputs=[])
    return build_model(main, init)


@pytest.mark.parametrize("engine", ENGINES)
def test_if(engine):
    model = if_model()
    a, b = ours(model, engine), theirs(model)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for flag in (True, False, True):
        cond = np.array([flag])
        expected = invoke(b, cond, x)
        np.testing.assert_allclose(invoke(a, cond, x)[0], expected[0], rtol=1e-6)
        np.testing.assert_allclose(expected[0], x * 2 if flag else x - 1, rtol=1e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_while(engine):
    model = while_model()
    a, b = ours(model, engine), theirs(model)
    for start, n in ((0, 4), (3, 3), (2, 7)):
        args = (np.int32(start), np.array([1.0, -2.0], np.float32), np.int32(n))
        expected = invoke(b, *args)
        actual = invoke(a, *args)
        assert int(actual[0]) == int(expected[0]) == max(start, n)
        np.testing.assert_allclose(actual[1], expected[1], rtol=1e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_resource_variable_initialised_once_and_kept(engine):
    """LiteRT runs the CALL_ONCE initialiser on the first invoke only; reset_all_variables resets variable
    tensors, not resource variables."""
    model = counter_model()
    for _ in range(3):  # fresh interpreters: none may start from a state an earlier run left
        a, b = ours(model, engine), theirs(model)
        sequence = []
        for step in range(4):
            if step == 3:
                a.reset_all_variables()
                b.reset_all_variables()
            x = np.array([step + 1.0], np.float32)
            expected = invoke(b, x)[0]
            np.testing.assert_array_equal(invoke(a, x)[0], expected)
            sequence.append(float(expected[0]))
        assert sequence == [11.0, 13.0, 16.0, 20.0]


def test_read_before_assignment_is_a_clear_error():
    main = GraphBuilder("main")
    x = main.input("x", (1,))
    handle = main.op("VAR_HANDLE", [], options={"shared_name": "never_set"}, dtype="resource", shape=(), name="h")
    value = main.op("READ_VARIABLE", [handle], dtype="float32", shape=(1,), name="value")
    main.output(main.op("ADD", [value, x], options=NONE, name="sum"))
    it = ours(build_model(main), "numpy")
    with pytest.raises(RuntimeError, match="read before any assignment"):
        invoke(it, np.ones(1, np.float32))


def test_accuracy_guard_leaves_resource_variables_alone():
    """The guard runs every partition on a calibration input before the user's first run; on a scratch
    state, so the counter still starts from its initialiser's 10."""
    from delegate import read_model
    from delegate.planner import PlacementSettings
    from delegate.session import AccuracyBound, RunSettings, Session

    main = GraphBuilder("main")
    x = main.input("x", (1,))
    main.op("CALL_ONCE", [], options={"init_subgraph_index": 1}, outputs=[])
    handle = main.op("VAR_HANDLE", [], options={"shared_name": "total"}, dtype="resource", shape=(), name="h")
    total = main.op("ADD", [main.op("READ_VARIABLE", [handle], dtype="float32", shape=(1,), name="value"), x],
                    options=NONE, name="sum")
    main.op("ASSIGN_VARIABLE", [handle, total], outputs=[])
    main.output(main.op("TANH", [main.op("MUL", [total, main.const("k", np.array([0.01], np.float32))],
                                         options=NONE, name="scaled")], name="squashed"))
    init = GraphBuilder("init")
    h = init.op("VAR_HANDLE", [], options={"shared_name": "total"}, dtype="resource", shape=(), name="h")
    init.op("ASSIGN_VARIABLE", [h, init.const("ten", np.array([10.0], np.float32))], outputs=[])
    model = build_model(main, init)
    settings = RunSettings(backends=[("fakegpu", {}), ("cpu", {"engine": "numpy"})],
                           placement=PlacementSettings(partitioner="greedy"),
                           accuracy_guard=AccuracyBound(max_abs_error=0.01))
    session = Session(read_model(model), settings)
    assert "fakegpu" in {p.backend for p in session.executor.partitions}
    it = theirs(model)
    for _ in range(3):
        want = invoke(it, np.ones(1, np.float32))[0]
        np.testing.assert_allclose(session.run([np.ones(1, np.float32)])["squashed"], want, rtol=1e-6)
