"""The backward marker in C++: when the gradient reaches a module call's output, without Python.

A Python hook on an autograd node costs about 10 us of CPU per call on the tutorial model (the engine
takes the GIL, wraps the gradient in a Python tensor, calls the hook; the registration adds a dict and
a partial): 8-11% of a tutorial step with one marker per module call. This marker is a C++
``FunctionPreHook`` on the output's autograd node that writes the moment (``steady_clock``, the
clock of ``time.perf_counter`` on Linux) into a slot of its step, and queues the engine's final
callback, in C++ too, to note when the backward pass ends. Python pays one call per marker in the
forward (about 1 us) and one per step to read the slots.

The extension is compiled against the installed torch the first time profiling wants it, on a thread
of its own (about 20 s of CPU once, in a compiler process), into a per-user cache keyed by the
source, torch, Python and the compiler, so that later processes load it in milliseconds. Until it is
ready, and wherever there is no C++ compiler, the build fails or the loaded marker's self-test
disagrees with ``time.perf_counter``, ``marker()`` answers None and the profiler keeps its Python
hooks: a speed-up, never a requirement. ``COMGRA_NATIVE_MARKER=0`` switches it off. CPU clocks
only: on a GPU a mark is a CUDA event recorded on the stream, which stays a Python hook.

Steps are told apart by a generation number: a hook left on the graph of an earlier step (a graph
kept and differentiated later) writes nothing into the current one. Under compiled autograd the hook
is left out of the compiled graph (no backward time) rather than failing the user's backward.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import platform
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch

from comgra.capture import native_build

SOURCE = r"""
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/python_variable.h>
#include <pybind11/pybind11.h>

namespace py = pybind11;
using torch::autograd::variable_list;

static int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One profiled step's marks. Guarded by a mutex: on a GPU the engine runs nodes on one thread per device.
struct State {
  std::mutex mutex;
  int64_t generation = 0;
  std::vector<int64_t> starts;    // per slot: when the gradient reached its node (0: not reached)
  std::vector<int64_t> finishes;  // when each backward pass of the step ended
  bool finish_queued = false;
  std::string error;              // a fault of ours: reported at the step's end, never thrown into the backward
};

static void backward_finished(const std::shared_ptr<State>& state, int64_t generation) {
  int64_t moment = now_ns();
  std::lock_guard<std::mutex> lock(state->mutex);
  state->finish_queued = false;
  if (state->generation == generation) state->finishes.push_back(moment);
}

struct Mark : torch::autograd::FunctionPreHook {
  std::shared_ptr<State> state;
  int64_t generation;
  size_t slot;
  Mark(std::shared_ptr<State> s, int64_t g, size_t i) : state(std::move(s)), generation(g), slot(i) {}

  variable_list operator()(const variable_list& grads) override {
    int64_t moment = now_ns();
    bool queue = false;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (state->generation != generation) return grads;  // the graph of an earlier step
      if (state->starts[slot] == 0) state->starts[slot] = moment;
      if (!state->finish_queued) queue = state->finish_queued = true;
    }
    if (queue) {
      try {
        std::shared_ptr<State> s = state;
        int64_t g = generation;
        torch::autograd::Engine::get_default_engine().queue_callback([s, g]() { backward_finished(s, g); });
      } catch (const std::exception& error) {
        std::lock_guard<std::mutex> lock(state->mutex);
        state->error = error.what();
      }
    }
    return grads;
  }

  // Compiled autograd collects hooks through this; ours is left out of the compiled graph (no time) rather
  // than failing the user's backward with "compiled_args nyi".
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {}
};

// Python's side: the records each slot marks (Python objects, so here and not in State, which a hook may be the
// last to hold on a thread without the GIL). Every method runs with the GIL held.
struct Marker {
  std::shared_ptr<State> state = std::make_shared<State>();
  std::vector<std::vector<py::object>> slot_records;
  Py_ssize_t start_index;  // where a record (a Python list) keeps its backward start
  explicit Marker(Py_ssize_t index) : start_index(index) {}

  void open() {
    std::lock_guard<std::mutex> lock(state->mutex);
    state->generation += 1;
    state->starts.clear();
    state->finishes.clear();
    state->finish_queued = false;
    state->error.clear();
    slot_records.clear();
  }

  // Marks the tensor's autograd node for ``record``: with a new slot, or with the slot an earlier call of this
  // step set on the same node (reached at the same moment: a parent that returns its child's output). False:
  // not a tensor with an autograd node.
  bool mark(py::handle tensor, py::handle record) {
    if (!THPVariable_Check(tensor.ptr())) return false;
    const at::Tensor& variable = THPVariable_Unpack(tensor.ptr());
    const auto& node = variable.grad_fn();
    if (!node) return false;
    size_t slot = slot_records.size();
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      for (const auto& hook : node->pre_hooks()) {
        auto* ours = dynamic_cast<Mark*>(hook.get());
        if (ours != nullptr && ours->state == state && ours->generation == state->generation) slot = ours->slot;
      }
      if (slot == slot_records.size()) {
        state->starts.push_back(0);
        node->add_pre_hook(std::make_unique<Mark>(state, state->generation, slot));
      }
    }
    if (slot == slot_records.size()) slot_records.emplace_back();
    slot_records[slot].push_back(py::reinterpret_borrow<py::object>(record));
    return true;
  }

  // Ends the step: each reached slot's moment (seconds) into its records' backward start where that is still
  // None; returns the ends of the step's backward passes and an error message ("" for none). Hooks still on
  // the step's graph write nothing from now on.
  py::tuple close() {
    std::vector<int64_t> starts;
    py::list finishes;
    std::string error;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      state->generation += 1;
      starts.swap(state->starts);
      for (int64_t finish : state->finishes) finishes.append(py::float_(static_cast<double>(finish) * 1e-9));
      error.swap(state->error);
      state->finishes.clear();
      state->finish_queued = false;
    }
    for (size_t slot = 0; slot < slot_records.size() && slot < starts.size(); ++slot) {
      if (!starts[slot]) continue;
      for (const auto& record : slot_records[slot]) {
        PyObject* list = record.ptr();
        if (PyList_Check(list) && PyList_GET_SIZE(list) > start_index && PyList_GET_ITEM(list, start_index) == Py_None) {
          PyObject* moment = PyFloat_FromDouble(static_cast<double>(starts[slot]) * 1e-9);
          if (moment == nullptr) throw py::error_already_set();
          PyList_SetItem(list, start_index, moment);  // takes the reference; releases the None
        }
      }
    }
    slot_records.clear();
    return py::make_tuple(finishes, error);
  }
};

PYBIND11_MODULE(comgra_native_marker, module) {
  py::class_<Marker>(module, "Marker")
      .def(py::init<Py_ssize_t>())
      .def("open", &Marker::open)
      .def("mark", &Marker::mark)
      .def("close", &Marker::close);
  module.def("now", []() { return static_cast<double>(now_ns()) * 1e-9; });
}
"""

MODULE_NAME = "comgra_native_marker"  # PYBIND11_MODULE's name: the loader looks for PyInit_<name>
BUILD_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c++17", "-w")
BUILD_THREAD = "comgra-marker-build"


def marker(start_index: int) -> Any:
    """A new native ``Marker``, or None while it is not built, or where it cannot be. The first call starts the
    build on a thread of its own; loading and the self-test run on the caller's.

    ``open()`` starts a step; ``mark(tensor, record)`` marks the tensor's autograd node for a record (a list;
    False where the tensor has no node); ``close()`` puts each reached mark's moment into its records at
    ``start_index`` (where None) and answers ``(ends of the step's backward passes, error message or "")``."""
    module = _BUILD.get()
    return None if module is None else module.Marker(start_index)


def ensure_built(timeout: float = 300.0) -> bool:
    """Build (or load) the marker now and wait for it; True if it is usable. For tests and benchmarks."""
    return _BUILD.ensure_built(timeout)


def _compiler() -> str | None:
    return native_build.find_compiler("CXX", ("c++", "g++", "clang++"))


def _torch_paths() -> tuple[Path, Path]:
    root = Path(torch.__file__).parent
    return root / "include", root / "lib"


def _command(source: Path, target: Path) -> list[str]:
    include, lib = _torch_paths()
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return [str(_compiler()), *BUILD_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{include}",
            f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(target), f"-L{lib}",
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{lib}"]


def _library_path() -> Path | None:
    """Where this source, built by this compiler against this torch and Python, lives in the cache."""
    compiler = _compiler()
    if compiler is None or sys.platform not in ("linux", "darwin"):
        return None
    parts = [SOURCE, *BUILD_FLAGS, compiler, torch.__version__, str(Path(torch.__file__).parent), sys.version,
             platform.machine(), sys.platform]
    return native_build.cached_library("native_marker", parts, importlib.machinery.EXTENSION_SUFFIXES[0])


def _build(library: Path) -> None:
    """Compile; loading (with the self-test) waits for the next ``marker()`` on the training thread."""
    native_build.compile_atomically(library, SOURCE, "native_marker.cpp", _command, timeout=600)


def _load(library: Path) -> Any:
    """The extension, once it has marked one small backward pass right: None where it cannot be loaded or is
    wrong (its clock must be ``time.perf_counter``'s, since its marks are set beside the forward's)."""
    try:
        loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, str(library))
        spec = importlib.util.spec_from_file_location(MODULE_NAME, str(library), loader=loader)
        if spec is None:
            return None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module if _self_test(module) else None
    except Exception:  # noqa: BLE001 - a build for another torch, a missing symbol: the Python hooks stay
        return None


def _self_test(module: Any) -> bool:
    probe = module.Marker(1)
    leaf = torch.ones(3, requires_grad=True)
    first: list[Any] = ["first", None]
    again: list[Any] = ["again", None]
    unreached: list[Any] = ["unreached", None]
    with torch.enable_grad():
        before = time.perf_counter()
        probe.open()
        output = leaf * 2.0
        marked = probe.mark(output, first) and probe.mark(output, again) and probe.mark(leaf * 3.0, unreached)
        output.sum().backward()
        finishes, error = probe.close()
        after = time.perf_counter()
    return (marked and not probe.mark(leaf, first) and not error and len(finishes) == 1 and unreached[1] is None
            and first[1] is not None and first[1] == again[1] and before <= first[1] <= finishes[0] <= after)


# Late-bound lambdas: tests replace the module's functions to see a failing or a refused build.
_BUILD = native_build.LazyBuild(thread_name=BUILD_THREAD, switch="COMGRA_NATIVE_MARKER",
                                library_path=lambda: _library_path(), build=lambda path: _build(path),
                                load=lambda path: _load(path))
