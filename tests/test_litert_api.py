"""LiteRT's Python interpreter tests (tflite/python/interpreter_test.py), re-expressed on builder-made
models and run against both ai_edge_litert's Interpreter and delegate's, so the two cannot drift.

Every case asserts one exact expectation that both implementations must meet; ``impl`` picks the
implementation (delegate on each of its CPU engines).
"""

import pathlib

import numpy as np
import pytest

from delegate import interpreter as delegate_interpreter
from delegate.config import load_config
from delegate.ir import DimensionMetadata, Sparsity
from delegate.tflite.builder import GraphBuilder, build_model
from tests.oputil import litert

IMPLS = ["litert", "delegate-numpy", "delegate-litert"]
NONE = {"fused_activation_function": "NONE"}


class Impl:
    """One implementation's module: its Interpreter (with delegate's config), OpResolverType, ..."""

    def __init__(self, name):
        self.name = name
        self.module = litert if name == "litert" else delegate_interpreter
        engine = name.rsplit("-", 1)[-1]
        self.config = None if name == "litert" else load_config("configs/cpu.yaml",
                                                                   overrides=[f"cpu.engine={engine}"])

    def Interpreter(self, **kwargs):
        if self.config is not None:
            kwargs.setdefault("config", self.config)
        return self.module.Interpreter(**kwargs)

    def InterpreterWithCustomOps(self, **kwargs):
        if self.config is not None:
            kwargs.setdefault("config", self.config)
        return self.module.InterpreterWithCustomOps(**kwargs)


@pytest.fixture(params=IMPLS)
def impl(request):
    return Impl(request.param)


# -- models (the ones interpreter_test.py loads from testdata, built here) -------------------------
PERMUTATION = np.array([[0, 0, 0, 1], [0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0]])


def permute_float() -> bytes:
    b = GraphBuilder()
    x = b.input("input", (1, 4))
    b.output(b.op("FULLY_CONNECTED", [x, b.const("weights", PERMUTATION.astype(np.float32)), None],
                  options=NONE, name="output"))
    return b.to_bytes()


def permute_uint8() -> bytes:
    b = GraphBuilder()
    x = b.input("input", (1, 4), "uint8", quant=(1.0, 0))
    w = b.const("weights", PERMUTATION.astype(np.uint8), quant=(1.0, 0))
    b.output(b.op("FULLY_CONNECTED", [x, w, b.const("bias", np.zeros(4, np.int32), quant=(1.0, 0))],
                  options=NONE, name="output", quant=(1.0, 0)))
    return b.to_bytes()


def gather_string(shape=(10,)) -> bytes:
    b = GraphBuilder()
    params = b.input("input", shape, "string")
    indices = b.input("indices", (3,), "int64")
    b.output(b.op("GATHER", [params, indices], options={"axis": 0}, shape=(3,), name="output"))
    return b.to_bytes()


def string_scalar() -> bytes:
    b = GraphBuilder()
    x = b.input("input", (), "string")
    b.output(b.op("RESHAPE", [x, b.const("shape", np.array([1], np.int32))], shape=(1,), name="output"))
    return b.to_bytes()


def add_mul() -> bytes:
    """Two inputs: out = (x + y) * y."""
    b = GraphBuilder()
    x, y = b.input("x", (1, 4)), b.input("y", (1, 4))
    s = b.op("ADD", [x, y], options=NONE, name="sum")
    b.output(b.op("MUL", [s, y], options=NONE, name="out"))
    return b.to_bytes()


def two_signatures() -> bytes:
    """Subgraph 0 adds, subgraph 1 multiplies; one signature each."""
    builders = []
    for name, opcode in (("add", "ADD"), ("multiply", "MUL")):
        b = GraphBuilder(name)
        x, y = b.input(f"{name}_x:0", (1,)), b.input(f"{name}_y:0", (1,))
        b.output(b.op(opcode, [x, y], options=NONE, name=f"{name}_out"))
        builders.append(b)
    return build_model(*builders, signatures=["add", "multiply"])


def dynamic_fc() -> bytes:
    b = GraphBuilder()
    x = b.input("x", (1, 4), shape_signature=(-1, 4))
    y = b.op("FULLY_CONNECTED", [x, b.const("w", np.arange(12, dtype=np.float32).reshape(3, 4) / 10)],
             options={"fused_activation_function": "RELU"}, name="fc")
    b.output(b.op("SOFTMAX", [y], options={"beta": 1.0}, name="probs"))
    return b.to_bytes()


def dynamic_sum() -> bytes:
    b = GraphBuilder()
    x = b.input("x", (1,), shape_signature=(-1,))
    b.output(b.op("SUM", [x, b.const("axis", np.array([0], np.int32))], options={"keep_dims": False},
                  shape=(), name="total"))
    return b.to_bytes()


def per_channel_conv() -> bytes:
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 4, 2), "int8", quant=(0.05, 1))
    scales = rng.uniform(0.01, 0.02, 128).astype(np.float32)
    w = b.const("w", rng.integers(-127, 128, (128, 1, 1, 2)).astype(np.int8), quant=(scales, np.zeros(128), 0))
    bias = b.const("bias", np.zeros(128, np.int32), quant=(scales * 0.05, np.zeros(128), 0))
    b.output(b.op("CONV_2D", [x, w, bias], options={"padding": "VALID", "stride_w": 1, "stride_h": 1, **NONE},
                  quant=(0.1, 0), name="y"))
    return b.to_bytes()


SPARSE_VALUES = np.array([1, 0, 0, 4, 2, 3, 0, 0, 5, 0, 0, 6], np.float32)


def sparse_densify() -> bytes:
    """A 4x4 constant as 2x2 blocks, block rows CSR-compressed (segments [0,2,3], indices [0,1,1])."""
    b = GraphBuilder()
    w = b.tensor("sparse", (4, 4), data=SPARSE_VALUES)
    w.sparsity = Sparsity([0, 1, 2, 3], [0, 1], [
        DimensionMetadata("DENSE", 2), DimensionMetadata("SPARSE_CSR", 0, np.array([0, 2, 3], np.int32),
                                                         np.array([0, 1, 1], np.int32)),
        DimensionMetadata("DENSE", 2), DimensionMetadata("DENSE", 2)])
    dense = b.op("DENSIFY", [w], shape=(4, 4), name="dense")
    x = b.input("x", (4, 4))
    b.output(b.op("ADD", [x, dense], options=NONE, name="out"))
    return b.to_bytes()


def quantization_params(details):
    q = details["quantization_parameters"]
    return list(q["scales"]), list(q["zero_points"]), q["quantized_dimension"]


# -- InterpreterTest --------------------------------------------------------------------------------
def test_path_like_model(impl, tmp_path):
    path = tmp_path / "permute_float.tflite"
    path.write_bytes(permute_float())
    impl.Interpreter(model_path=pathlib.Path(path)).allocate_tensors()


@pytest.mark.parametrize("threads, message", [(-1, "num_threads should >= 1"),
                                              (4.2, "type of num_threads should be int")])
def test_num_threads_checked(impl, threads, message):
    with pytest.raises(ValueError, match=message):
        impl.Interpreter(model_content=permute_float(), num_threads=threads)


def test_unrecognized_op_resolver_type(impl):
    with pytest.raises(ValueError, match="Unrecognized passed in op resolver type: test"):
        impl.Interpreter(model_content=permute_float(), experimental_op_resolver_type="test")


@pytest.mark.parametrize("resolver", ["BUILTIN", "BUILTIN_REF", "BUILTIN_WITHOUT_DEFAULT_DELEGATES"])
def test_float_with_each_op_resolver_type(impl, resolver):
    it = impl.Interpreter(model_content=permute_float(),
                          experimental_op_resolver_type=impl.module.OpResolverType[resolver])
    it.allocate_tensors()
    (inp,), (out,) = it.get_input_details(), it.get_output_details()
    for d, name in ((inp, "input"), (out, "output")):
        assert d["name"] == name and d["dtype"] == np.float32 and list(d["shape"]) == [1, 4]
        assert d["quantization"] == (0.0, 0) and quantization_params(d) == ([], [], 0)
    it.set_tensor(inp["index"], np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(out["index"]), [[4.0, 3.0, 2.0, 1.0]])


def test_float_with_two_threads(impl):
    it = impl.Interpreter(model_content=permute_float(), num_threads=2)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), [[4.0, 3.0, 2.0, 1.0]])


def test_uint8(impl):
    it = impl.Interpreter(model_content=permute_uint8())
    it.allocate_tensors()
    (inp,), (out,) = it.get_input_details(), it.get_output_details()
    for d in (inp, out):
        assert d["dtype"] == np.uint8 and list(d["shape"]) == [1, 4]
        assert d["quantization"] == (1.0, 0) and quantization_params(d) == ([1.0], [0], 0)
    x = np.array([[1, 2, 3, 4]], np.uint8)
    it.resize_tensor_input(inp["index"], x.shape)
    it.allocate_tensors()
    it.set_tensor(inp["index"], x)
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(out["index"]), [[4, 3, 2, 1]])


def test_string(impl):
    it = impl.Interpreter(model_content=gather_string())
    it.allocate_tensors()
    params, indices = it.get_input_details()
    (out,) = it.get_output_details()
    assert (params["name"], params["dtype"], list(params["shape"])) == ("input", np.bytes_, [10])
    assert (indices["name"], indices["dtype"], list(indices["shape"])) == ("indices", np.int64, [3])
    assert (out["dtype"], list(out["shape"])) == (np.bytes_, [3])
    it.set_tensor(indices["index"], np.array([1, 2, 3], np.int64))
    it.set_tensor(params["index"], np.array(list("abcdefghij")))
    it.invoke()
    assert list(it.get_tensor(out["index"])) == [b"b", b"c", b"d"]


def test_string_zero_dim(impl):
    data = b"abcd" + bytes(16)
    it = impl.Interpreter(model_content=string_scalar())
    it.allocate_tensors()
    index = it.get_input_details()[0]["index"]
    it.set_tensor(index, np.array(data))
    assert len(it.get_tensor(index).item(0)) == len(data)


def test_per_channel_params(impl):
    it = impl.Interpreter(model_content=per_channel_conv())
    it.allocate_tensors()
    weights = next(d for d in it.get_tensor_details() if d["name"] == "w")
    q = weights["quantization_parameters"]
    assert len(q["scales"]) == 128 and q["quantized_dimension"] == 0 and q["block_size"] == 0


def test_dense_tensor_has_no_sparsity(impl):
    it = impl.Interpreter(model_content=per_channel_conv())
    it.allocate_tensors()
    assert next(d for d in it.get_tensor_details() if d["name"] == "w")["sparsity_parameters"] == {}


def test_sparse_tensor_access(impl):
    it = impl.Interpreter(model_content=sparse_densify())
    it.allocate_tensors()
    np.testing.assert_array_equal(it.get_tensor(0), SPARSE_VALUES)
    s = it.get_tensor_details()[0]["sparsity_parameters"]
    assert list(s["traversal_order"]) == [0, 1, 2, 3] and list(s["block_map"]) == [0, 1]
    for i in (0, 2, 3):
        assert s["dim_metadata"][i] == {"format": 0, "dense_size": 2}
    assert s["dim_metadata"][1]["format"] == 1
    assert list(s["dim_metadata"][1]["array_segments"]) == [0, 2, 3]
    assert list(s["dim_metadata"][1]["array_indices"]) == [0, 1, 1]


# -- InterpreterTestErrorPropagation -------------------------------------------------------------
@pytest.mark.parametrize("content", [b"short", b"wrong_identifier"])
def test_invalid_model_content(impl, content):
    with pytest.raises(ValueError):
        impl.Interpreter(model_content=content)


def test_invalid_model_file(impl):
    with pytest.raises(ValueError, match="totally_invalid_file_name"):
        impl.Interpreter(model_path="totally_invalid_file_name")


def test_invoke_before_ready(impl):
    with pytest.raises(RuntimeError, match="not ready"):
        impl.Interpreter(model_content=permute_float()).invoke()


def test_neither_path_nor_content(impl):
    with pytest.raises(ValueError, match="`model_path` or `model_content` must be specified"):
        impl.Interpreter(model_path=None, model_content=None)


def test_both_path_and_content(impl, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(permute_float())
    with pytest.raises(ValueError, match="Can't both provide"):
        impl.Interpreter(model_path=str(path), model_content=permute_float())


def test_invalid_indices(impl):
    it = impl.Interpreter(model_content=permute_float())
    it.allocate_tensors()
    with pytest.raises(ValueError):
        it._get_tensor_details(4, 0)
    with pytest.raises(ValueError, match="Invalid node index"):
        it._get_op_details(4)
    with pytest.raises(ValueError, match="tensor index"):
        it.get_tensor(99)
    with pytest.raises(ValueError, match="subgraph index"):
        it.get_tensor(0, subgraph_index=3)


def test_empty_input_tensor(impl):
    result = impl.Interpreter(model_content=dynamic_sum()).get_signature_runner()(x=np.zeros(0, np.float32))
    assert float(result["total"]) == 0.0


def test_unknown_keyword_is_a_type_error(impl):
    with pytest.raises(TypeError):
        impl.Interpreter(model_content=permute_float(), no_such_option=True)


def test_float64_into_float32_refused(impl):
    it = impl.Interpreter(model_content=permute_float())
    it.allocate_tensors()
    with pytest.raises(ValueError, match="(?i)float64"):
        it.set_tensor(0, np.zeros((1, 4)))
    with pytest.raises(ValueError, match="(?i)dimension"):
        it.set_tensor(0, np.zeros((2, 4), np.float32))


# -- InterpreterTensorAccessorTest ----------------------------------------------------------------
@pytest.fixture
def permute(impl):
    it = impl.Interpreter(model_content=permute_float())
    it.allocate_tensors()
    return it, it.get_input_details()[0]["index"], np.array([[-1.0, -2.0, -3.0, -4.0]], np.float32)


def test_tensor_accessor_is_a_reference(permute):
    it, index, data = permute
    ref = it.tensor(index)
    np.copyto(ref(), data)
    np.testing.assert_array_equal(ref(), data)
    np.testing.assert_array_equal(it.get_tensor(index), data)


def test_get_tensor_is_a_copy(permute):
    it, index, data = permute
    it.set_tensor(index, data)
    first = it.get_tensor(index)
    it.set_tensor(index, first + 1)
    np.testing.assert_array_equal(first, data)
    np.testing.assert_array_equal(it.get_tensor(index), data + 1)


def test_views_make_it_unsafe_to_run(permute):
    it, index, _ = permute
    assert it._safe_to_run()
    _ = it.tensor(index)
    assert it._safe_to_run()
    in0 = it.tensor(index)()
    assert not it._safe_to_run()
    in0b = it.tensor(index)()[0, :2]
    assert not it._safe_to_run()
    del in0, in0b
    assert it._safe_to_run()


def test_views_protect_allocate_and_invoke(permute):
    it, index, _ = permute
    in0 = it.tensor(index)()
    with pytest.raises(RuntimeError, match="at least 1 reference"):
        it.allocate_tensors()
    with pytest.raises(RuntimeError, match="at least 1 reference"):
        it.invoke()
    del in0
    held = it.tensor(index)
    it.allocate_tensors()
    assert held is not None


def test_input_written_through_view_is_used(permute):
    it, index, _ = permute
    inp, out = it.tensor(index), it.tensor(it.get_output_details()[0]["index"])
    for k in range(3):
        inp().fill(float(k))
        inp()[0, 0] = 10.0
        it.invoke()
        np.testing.assert_array_equal(out(), [[k, k, k, 10.0]])


# -- InterpreterNodeAccessTest --------------------------------------------------------------------
def test_valid_node(permute):
    it = permute[0]
    op = it._get_ops_details()[0]
    assert (op["index"], op["op_name"]) == (0, "FULLY_CONNECTED")
    assert list(op["inputs"]) == [0, 1, -1] and list(op["outputs"]) == [2]
    assert op["operand_types"] == [np.float32, np.float32] and op["result_types"] == [np.float32]


# -- delegates and custom ops ---------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # LiteRT's Delegate.__del__
def test_load_delegate_failure_is_an_error(impl):
    """LiteRT raises ValueError when a delegate fails to load (OSError when the library is missing)."""
    with pytest.raises((ValueError, OSError)):
        impl.module.load_delegate("no_such_delegate_library.so")


def test_interpreter_with_custom_ops(impl):
    it = impl.InterpreterWithCustomOps(model_content=permute_float())
    assert it._safe_to_run()
    with pytest.raises(ValueError):
        impl.InterpreterWithCustomOps(model_content=permute_float(),
                                      custom_op_registerers=["CompletelyBogusRegistererName"])


# -- InterpreterMultiSignatureTest ----------------------------------------------------------------
def test_num_subgraphs(impl):
    assert impl.Interpreter(model_content=permute_float()).num_subgraphs() == 1
    assert impl.Interpreter(model_content=two_signatures()).num_subgraphs() == 2


def test_tensor_details_single_signature(impl):
    it = impl.Interpreter(model_content=permute_float())
    details = it.get_tensor_details()
    assert len(details) == 3 and details[0]["name"] == "input"
    for bad in (1, -1):
        with pytest.raises(ValueError, match="subgraph_index is out of range"):
            it.get_tensor_details(subgraph_index=bad)


def test_tensor_details_two_signatures(impl):
    it = impl.Interpreter(model_content=two_signatures())
    for sub, name in ((0, "add_x:0"), (1, "multiply_x:0")):
        details = it.get_tensor_details(subgraph_index=sub)
        assert len(details) == 3 and details[0]["name"] == name
    with pytest.raises(ValueError, match="subgraph_index is out of range"):
        it.get_tensor_details(subgraph_index=3)


def test_each_signature_runs_its_own_subgraph(impl):
    it = impl.Interpreter(model_content=two_signatures())
    assert it.get_signature_list() == {"add": {"inputs": ["add_x:0", "add_y:0"], "outputs": ["add_out"]},
                                       "multiply": {"inputs": ["multiply_x:0", "multiply_y:0"],
                                                    "outputs": ["multiply_out"]}}
    x, y = np.array([3.0], np.float32), np.array([4.0], np.float32)
    mul = it.get_signature_runner("multiply")
    assert mul(**{"multiply_x:0": x, "multiply_y:0": y})["multiply_out"].tolist() == [12.0]
    add = it.get_signature_runner(signature_key="add")
    assert add(**{"add_x:0": x, "add_y:0": y})["add_out"].tolist() == [7.0]
    out = mul.get_output_details()["multiply_out"]["index"]
    assert it.get_tensor(out, subgraph_index=1).tolist() == [12.0]
    assert mul.get_input_details()["multiply_x:0"]["name"] == "multiply_x:0"


def test_signature_runner_errors(impl):
    it = impl.Interpreter(model_content=two_signatures())
    with pytest.raises(ValueError, match="signature_key is None"):
        it.get_signature_runner()
    with pytest.raises(ValueError, match="Invalid signature_key"):
        it.get_signature_runner("nope")
    runner = it.get_signature_runner("add")
    with pytest.raises(ValueError, match="Invalid number of inputs"):
        runner(**{"add_x:0": np.ones(1, np.float32)})
    with pytest.raises(ValueError, match="Invalid Input name"):
        runner(**{"add_x:0": np.ones(1, np.float32), "z": np.ones(1, np.float32)})


def test_signature_runner_resizes_dynamic_inputs(impl):
    it = impl.Interpreter(model_content=dynamic_fc())
    runner = it.get_signature_runner()
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    logits = np.maximum(x @ (np.arange(12, dtype=np.float32).reshape(3, 4) / 10).T, 0)
    expected = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(runner(x=x)["probs"], expected, rtol=1e-5)
    np.testing.assert_allclose(runner(x=x[:1])["probs"], expected[:1], rtol=1e-5)


# -- what real code does with multi-input models --------------------------------------------------
def test_set_tensor_one_input_at_a_time(impl):
    it = impl.Interpreter(model_content=add_mul())
    it.allocate_tensors()
    x, y = np.array([[1, 2, 3, 4]], np.float32), np.array([[2, 2, 0.5, -1]], np.float32)
    it.set_tensor(0, x)  # the other input is not set yet: no complaint
    it.set_tensor(1, y)
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), (x + y) * y)
    result = it.get_signature_runner()(x=y, y=x)
    np.testing.assert_array_equal(result["out"], (x + y) * x)


def test_invoke_without_set_tensor(impl):
    it = impl.Interpreter(model_content=add_mul())
    it.allocate_tensors()
    for _ in range(2):  # warm-up loops invoke on whatever the inputs hold
        it.invoke()
    out = it.get_output_details()[0]
    assert it.get_tensor(out["index"]).shape == (1, 4)
    it.set_tensor(0, np.ones((1, 4), np.float32))
    it.set_tensor(1, np.full((1, 4), 2, np.float32))
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(out["index"]), np.full((1, 4), 6, np.float32))


def test_preserve_all_tensors_keeps_intermediates(impl):
    it = impl.Interpreter(model_content=add_mul(), experimental_preserve_all_tensors=True,
                          experimental_op_resolver_type=impl.module.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    it.allocate_tensors()
    x, y = np.array([[1, 2, 3, 4]], np.float32), np.array([[5, 6, 7, 8]], np.float32)
    it.set_tensor(0, x)
    it.set_tensor(1, y)
    it.invoke()
    total = next(d["index"] for d in it.get_tensor_details() if d["name"] == "sum")
    np.testing.assert_array_equal(it.get_tensor(total), x + y)
    assert [d["name"] for d in it.get_output_details()] == ["out"]


def test_details_match_litert():
    """Every detail dictionary of a quantized and a float model, key by key, as LiteRT gives them."""
    for model in (permute_uint8(), per_channel_conv(), add_mul(), gather_string()):
        ours = Impl("delegate-numpy").Interpreter(model_content=model)
        theirs = litert.Interpreter(model_content=model)
        for it in (ours, theirs):
            it.allocate_tensors()
        for method in ("get_input_details", "get_output_details", "get_tensor_details"):
            for a, b in zip(getattr(ours, method)(), getattr(theirs, method)(), strict=True):
                assert a.keys() == b.keys()
                for key in a:
                    if isinstance(a[key], dict):
                        assert a[key].keys() == b[key].keys()
                        for k in a[key]:
                            np.testing.assert_array_equal(a[key][k], b[key][k], err_msg=f"{method} {key}.{k}")
                    else:
                        np.testing.assert_array_equal(a[key], b[key], err_msg=f"{method} {key}")


def test_errors_keep_the_projects_classes():
    from delegate.errors import DelegateError, ExecutionError, InputError

    it = Impl("delegate-numpy").Interpreter(model_content=permute_float())
    with pytest.raises(ExecutionError):
        it.invoke()
    it.allocate_tensors()
    with pytest.raises(InputError) as info:
        it.set_tensor(0, np.zeros((1, 4)))
    assert isinstance(info.value, DelegateError) and isinstance(info.value, ValueError)
    assert info.value.exit_code == 8


# -- further cases the issue lists -----------------------------------------------------------------
def test_strict_resize_only_changes_unknown_dimensions(impl):
    it = impl.Interpreter(model_content=dynamic_fc())
    it.resize_tensor_input(0, [5, 4], strict=True)
    it.allocate_tensors()
    assert list(it.get_input_details()[0]["shape"]) == [5, 4]
    assert list(it.get_output_details()[0]["shape"]) == [5, 3]
    with pytest.raises(RuntimeError):
        it.resize_tensor_input(0, [5, 6], strict=True)


def test_invoke_after_resize_needs_allocate(impl):
    it = impl.Interpreter(model_content=dynamic_fc())
    it.allocate_tensors()
    it.resize_tensor_input(0, [2, 4])
    with pytest.raises(RuntimeError):
        it.invoke()
    it.allocate_tensors()
    it.invoke()
    assert it.get_tensor(it.get_output_details()[0]["index"]).shape == (2, 3)


def test_constants_are_readable(impl):
    it = impl.Interpreter(model_content=permute_float())
    it.allocate_tensors()
    weights = next(d["index"] for d in it.get_tensor_details() if d["name"] == "weights")
    np.testing.assert_array_equal(it.get_tensor(weights), PERMUTATION)


def test_model_without_signatures(impl):
    b = GraphBuilder()
    b.output(b.op("RELU", [b.input("x", (2,))], name="y"))
    it = impl.Interpreter(model_content=build_model(b, signatures=[None]))
    assert it.get_signature_list() == {}
    with pytest.raises(ValueError, match="signature_key is None"):
        it.get_signature_runner()
    with pytest.raises(ValueError, match="Invalid signature_key"):
        it.get_signature_runner("serving_default")


def test_quantized_input_details(impl):
    b = GraphBuilder()
    x = b.input("x", (1, 3), "int8", quant=(0.5, -2))
    b.output(b.op("DEQUANTIZE", [x], dtype="float32", name="y"))
    it = impl.Interpreter(model_content=b.to_bytes())
    it.allocate_tensors()
    (d,) = it.get_input_details()
    assert d["dtype"] == np.int8 and d["quantization"] == (0.5, -2)
    assert quantization_params(d) == ([0.5], [-2], 0) and d["quantization_parameters"]["block_size"] == 0
    it.set_tensor(d["index"], np.array([[-2, 0, 4]], np.int8))
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), [[0.0, 1.0, 3.0]])


def test_output_view_follows_each_invoke(impl):
    it = impl.Interpreter(model_content=add_mul())
    it.allocate_tensors()
    out = it.tensor(it.get_output_details()[0]["index"])
    for k in (1.0, 2.0):
        it.set_tensor(0, np.full((1, 4), k, np.float32))
        it.set_tensor(1, np.full((1, 4), k, np.float32))
        it.invoke()
        np.testing.assert_array_equal(out(), np.full((1, 4), 2 * k * k, np.float32))
    held = out()
    with pytest.raises(RuntimeError, match="at least 1 reference"):
        it.invoke()
    with pytest.raises(RuntimeError, match="at least 1 reference"):
        it.resize_tensor_input(0, [1, 4])
    del held
    it.invoke()


def test_signature_runner_details_and_order_independence(impl):
    it = impl.Interpreter(model_content=add_mul())
    runner = it.get_signature_runner("serving_default")
    assert sorted(runner.get_input_details()) == ["x", "y"] and list(runner.get_output_details()) == ["out"]
    assert runner.get_input_details()["y"]["index"] == 1
    x, y = np.array([[1, 2, 3, 4]], np.float32), np.array([[4, 3, 2, 1]], np.float32)
    np.testing.assert_array_equal(runner(y=y, x=x)["out"], (x + y) * y)


def test_experimental_flags_accepted(impl):
    it = impl.Interpreter(model_content=permute_float(), experimental_disable_delegate_clustering=True,
                          experimental_default_delegate_latest_features=True,
                          experimental_disable_delegate_node_fusion=True,
                          experimental_force_delegate_node_profiling=True)
    assert it.experimental_compress_quantization_zero_points is False
    it.allocate_tensors()
    it.set_tensor(0, np.array([[1, 2, 3, 4]], np.float32))
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(2), [[4, 3, 2, 1]])


def test_reset_all_variables_on_a_stateless_model(impl):
    it = impl.Interpreter(model_content=permute_float())
    it.allocate_tensors()
    assert it.reset_all_variables() is None
    it.set_tensor(0, np.array([[1, 2, 3, 4]], np.float32))
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(2), [[4, 3, 2, 1]])
