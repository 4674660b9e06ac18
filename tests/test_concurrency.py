"""Eight threads, each with its own interpreter of one model and one shared kernel cache, agree."""

import threading

import numpy as np

from delegate import zoo
from delegate.config import load_config
from delegate.interpreter import Interpreter


def test_eight_threads_own_interpreters(tmp_path):
    data = zoo.build("posenet")
    cache = tmp_path / "cache"
    config = load_config("configs/cpu.yaml", overrides=[f"serialization.dir={cache}", "cpu.engine=numpy"])
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, (1, 257, 257, 3)).astype(np.float32) for _ in range(8)]

    def run_one(x):
        it = Interpreter(model_content=data, config=config)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        return [it.get_tensor(d["index"]) for d in it.get_output_details()]

    expected = [run_one(x) for x in inputs]
    results, errors = [None] * 8, []

    def worker(i):
        try:
            for _ in range(3):
                results[i] = run_one(inputs[i])
        except Exception as exc:  # reported below with the thread's index
            errors.append((i, exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for got, want in zip(results, expected):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
