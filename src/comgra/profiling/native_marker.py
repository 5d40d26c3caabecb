"""The backward marker in C++: when the gradient reaches a module call's output, without Python.

A Python hook on an autograd node costs about 10 us of CPU per call on the tutorial model (the engine
takes the GIL, wraps the gradient in a Python tensor, calls the hook; the registration adds a dict and
a partial): 8-11% of a tutorial step with one marker per module call. This marker is a C++
``FunctionPreHook`` on the output's autograd node that writes the moment (``steady_clock``, the
clock of ``time.perf_counter`` on Linux) into a slot of its step, and queues the engine's final
callback, in C++ too, to note when the backward pass ends. Python pays one call per marker in the
forward (about 0.1 us; none where the C++ handler below measures the call) and one per step to read the
slots.

The extension is compiled against the installed torch the first time profiling wants it, on a thread
of its own (about 20 s of CPU once, in a compiler process), into a per-user cache keyed by the
source, torch, Python and the compiler, so that later processes load it in milliseconds. Until it is
ready, and wherever there is no C++ compiler, the build fails or the loaded marker's self-test
disagrees with ``time.perf_counter``, ``marker()`` answers None and the profiler keeps its Python
hooks: a speed-up, never a requirement. ``COMGRA_NATIVE_MARKER=0`` switches it off. CPU clocks
only: on a GPU a mark is a CUDA event recorded on the stream, which stays a Python hook.

The same extension measures the module calls of a plain profiled step (``lean_handler``): the Python
handler's lean path (two clock reads, the record, the output's bytes, the mark) in C++, about 2 us
less per call, handing every other call to the Python handler. Both ``mark`` and the handler are plain
CPython functions (``METH_FASTCALL``), not pybind11 methods: called between a module's own operators,
pybind11's general dispatch costs about 1.2 us a call, having been pushed out of the instruction cache.

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

from comgra import native_build

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
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <pybind11/pybind11.h>

namespace py = pybind11;
using torch::autograd::variable_list;

static int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds as time.perf_counter() gives them for the same moment (CPython divides its nanoseconds by 1e9).
static double to_seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

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
  // For ``lean_call``: the step's records while a profiled step is in progress (null or None between them: calls go
  // straight to the forward), and whether this path may measure its calls (false: each goes to the Python handler).
  py::object records;
  bool lean = false;
  explicit Marker(Py_ssize_t index) : start_index(index) {}

  void route(py::object step_records, bool lean_calls) {
    records = std::move(step_records);
    lean = lean_calls;
  }

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
      for (int64_t finish : state->finishes) finishes.append(py::float_(to_seconds(finish)));
      error.swap(state->error);
      state->finishes.clear();
      state->finish_queued = false;
    }
    for (size_t slot = 0; slot < slot_records.size() && slot < starts.size(); ++slot) {
      if (!starts[slot]) continue;
      for (const auto& record : slot_records[slot]) {
        PyObject* list = record.ptr();
        if (PyList_Check(list) && PyList_GET_SIZE(list) > start_index && PyList_GET_ITEM(list, start_index) == Py_None) {
          PyObject* moment = PyFloat_FromDouble(to_seconds(starts[slot]));
          if (moment == nullptr) throw py::error_already_set();
          PyList_SetItem(list, start_index, moment);  // takes the reference; releases the None
        }
      }
    }
    slot_records.clear();
    return py::make_tuple(finishes, error);
  }
};

// -- one module call, measured without Python (``lean_call``) --------------------------------------------------------
// What the Python handler's lean path does (layer_calls.CallMarks.forward_handler), for the calls of a plain profiled
// step: a record [layer, forward start, forward end, output bytes, None, None, None, subtree end] appended to the
// step's records, the forward called in between, the output marked. Everything else goes to the Python handler.
static const char* const CALL_CAPSULE = "comgra_native_marker.LeanCall";
enum { LAYER_ITEM, FORWARD_START_ITEM, FORWARD_END_ITEM, BYTES_ITEM, RECORD_SIZE = 8, SUBTREE_END_ITEM = 7 };

struct LeanCall {
  py::object marker_object;  // keeps the Marker alive
  Marker* marker;
  py::object layer;
  py::object fallback;      // the Python handler: (module, forward, args, kwargs) -> output
  py::object other_output;  // (record, output): an output that is not one plain tensor, noted in Python
  py::object fail;          // (error): a fault of ours; profiling stops, training goes on
  py::object fx_globals;    // torch.fx._symbolic_trace's globals, and its flag set while FX traces
  py::object fx_flag;
};

static void release_call(PyObject* capsule) {
  delete static_cast<LeanCall*>(PyCapsule_GetPointer(capsule, CALL_CAPSULE));
}

static PyObject* call_forward(PyObject* forward, PyObject* module, PyObject* args, PyObject* kwargs) {
  Py_ssize_t count = PyTuple_GET_SIZE(args);
  PyObject* small[8];
  std::vector<PyObject*> large;
  PyObject** stack = small;
  if (count + 1 > 8) {
    large.resize(count + 1);
    stack = large.data();
  }
  stack[0] = module;
  for (Py_ssize_t i = 0; i < count; ++i) stack[i + 1] = PyTuple_GET_ITEM(args, i);
  bool no_keywords = kwargs == Py_None || PyDict_GET_SIZE(kwargs) == 0;
  return PyObject_VectorcallDict(forward, stack, count + 1, no_keywords ? nullptr : kwargs);
}

// A fault of ours (the Python error now set, or ``message``): handed to the profiler's fail(), never raised.
static void report(LeanCall* call, const char* message) {
  if (message != nullptr) PyErr_SetString(PyExc_RuntimeError, message);
  PyObject* type;
  PyObject* value;
  PyObject* traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  PyObject* result = PyObject_CallOneArg(call->fail.ptr(), value != nullptr ? value : Py_None);
  if (result == nullptr) PyErr_Clear();  // fail() itself failed: nothing more can be done without breaking the call
  Py_XDECREF(result);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
}

static PyObject* lean_call(PyObject* capsule, PyObject* const* args, Py_ssize_t count) {
  auto* call = static_cast<LeanCall*>(PyCapsule_GetPointer(capsule, CALL_CAPSULE));
  if (call == nullptr) return nullptr;
  if (count != 4 || !PyTuple_Check(args[2]) || (args[3] != Py_None && !PyDict_Check(args[3]))) {
    PyErr_SetString(PyExc_TypeError, "a forward handler takes (module, forward, args, kwargs)");
    return nullptr;
  }
  Marker* marker = call->marker;
  PyObject* records = marker->records.ptr();
  if (records == nullptr || records == Py_None) return call_forward(args[1], args[0], args[2], args[3]);
  PyObject* fx_flag = PyDict_GetItem(call->fx_globals.ptr(), call->fx_flag.ptr());  // borrowed; sets no error
  if (!marker->lean || !PyList_Check(records) || torch::jit::tracer::isTracing() ||
      torch::profiler::impl::profilerEnabled() || (fx_flag != nullptr && fx_flag != Py_False)) {
    return PyObject_Vectorcall(call->fallback.ptr(), args, 4, nullptr);
  }
  PyObject* record = PyList_New(RECORD_SIZE);
  PyObject* start = record == nullptr ? nullptr : PyFloat_FromDouble(to_seconds(now_ns()));
  if (start != nullptr) {
    for (Py_ssize_t i = 0; i < RECORD_SIZE; ++i) PyList_SET_ITEM(record, i, Py_NewRef(Py_None));
    PyList_SetItem(record, LAYER_ITEM, Py_NewRef(call->layer.ptr()));  // each steals its reference
    PyList_SetItem(record, FORWARD_START_ITEM, start);
    PyList_SetItem(record, BYTES_ITEM, PyLong_FromLong(0));  // a cached small int: cannot fail
  }
  if (start == nullptr || PyList_Append(records, record) != 0) {
    Py_XDECREF(record);
    report(call, nullptr);
    return call_forward(args[1], args[0], args[2], args[3]);
  }
  Py_INCREF(records);  // compared after the forward: the step may end (or profiling fail) while it runs
  PyObject* output = call_forward(args[1], args[0], args[2], args[3]);
  int64_t end = now_ns();
  PyObject* type;
  PyObject* value;
  PyObject* traceback;
  PyErr_Fetch(&type, &value, &traceback);  // the forward's error, if it raised: kept while the record is finished
  PyObject* end_item = PyFloat_FromDouble(to_seconds(end));
  PyObject* subtree_end = PyLong_FromSsize_t(PyList_GET_SIZE(records));
  if (end_item != nullptr && subtree_end != nullptr) {
    PyList_SetItem(record, FORWARD_END_ITEM, end_item);  // steals, releasing the None
    PyList_SetItem(record, SUBTREE_END_ITEM, subtree_end);
  } else {
    Py_XDECREF(end_item);
    Py_XDECREF(subtree_end);
    PyErr_Clear();
  }
  PyErr_Restore(type, value, traceback);
  bool same_step = marker->records.ptr() == records;
  Py_DECREF(records);
  if (output == nullptr || !same_step) {
    Py_DECREF(record);
    return output;
  }
  if (THPVariable_CheckExact(output)) {
    try {
      PyObject* bytes = PyLong_FromSize_t(THPVariable_Unpack(output).nbytes());
      if (bytes == nullptr) throw py::error_already_set();
      PyList_SetItem(record, BYTES_ITEM, bytes);
      marker->mark(output, record);
    } catch (py::error_already_set& error) {
      error.restore();
      report(call, nullptr);
    } catch (const std::exception& error) {
      report(call, error.what());
    }
  } else {
    PyObject* result = PyObject_CallFunctionObjArgs(call->other_output.ptr(), record, output, nullptr);
    if (result == nullptr) report(call, nullptr);
    Py_XDECREF(result);
  }
  Py_DECREF(record);
  return output;
}

static PyMethodDef lean_call_definition = {"measured_forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(lean_call)),
                                           METH_FASTCALL, "measured_forward(module, forward, args, kwargs) -> output"};

// ``marker.mark``: a plain CPython function (METH_FASTCALL) bound to a capsule of its Marker, not a pybind11
// method. It runs once per module call between the module's own operators, where pybind11's general dispatch
// (a bound method object, the overload loop, the argument casters: code the operators have pushed out of the
// instruction cache) cost about 1.2 us a call against about 0.1 us for this.
static const char* const MARKER_CAPSULE = "comgra_native_marker.Marker";

static PyObject* fast_mark(PyObject* capsule, PyObject* const* args, Py_ssize_t count) {
  if (count != 2) {
    PyErr_SetString(PyExc_TypeError, "mark(tensor, record) takes 2 arguments");
    return nullptr;
  }
  auto* marker = static_cast<Marker*>(PyCapsule_GetPointer(capsule, MARKER_CAPSULE));
  if (marker == nullptr) return nullptr;
  try {
    return PyBool_FromLong(marker->mark(args[0], args[1]));
  } catch (py::error_already_set& error) {
    error.restore();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
  return nullptr;
}

static PyMethodDef fast_mark_definition = {"mark", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_mark)),
                                           METH_FASTCALL, "mark(tensor, record) -> bool"};

static void release_marker(PyObject* capsule) {
  Py_XDECREF(static_cast<PyObject*>(PyCapsule_GetContext(capsule)));  // the Marker's Python object
}

PYBIND11_MODULE(comgra_native_marker, module) {
  py::class_<Marker>(module, "Marker")
      .def(py::init<Py_ssize_t>())
      .def("open", &Marker::open)
      .def("route", &Marker::route)
      .def_property_readonly("mark", [](py::object self) {
        py::capsule capsule(static_cast<void*>(self.cast<Marker*>()), MARKER_CAPSULE, release_marker);
        if (PyCapsule_SetContext(capsule.ptr(), self.inc_ref().ptr()) != 0) throw py::error_already_set();
        PyObject* function = PyCFunction_New(&fast_mark_definition, capsule.ptr());
        if (function == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(function);
      })
      .def("close", &Marker::close);
  // A module's forward handler that measures plain calls in C++ (see lean_call); the others go to ``fallback``.
  module.def("lean_handler", [](py::object marker, py::object layer, py::object fallback, py::object other_output,
                                py::object fail, py::dict fx_globals, py::str fx_flag) {
    auto* call = new LeanCall{marker, marker.cast<Marker*>(), layer, fallback, other_output, fail, fx_globals, fx_flag};
    PyObject* capsule = PyCapsule_New(call, CALL_CAPSULE, release_call);
    if (capsule == nullptr) {
      delete call;
      throw py::error_already_set();
    }
    PyObject* function = PyCFunction_New(&lean_call_definition, capsule);
    Py_DECREF(capsule);  // the function holds it
    if (function == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(function);
  });
  module.def("now", []() { return to_seconds(now_ns()); });
}
"""

MODULE_NAME = "comgra_native_marker"  # PYBIND11_MODULE's name: the loader looks for PyInit_<name>
BUILD_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c++17", "-w")
BUILD_THREAD = "comgra-marker-build"
FX_FLAG = "_is_fx_tracing_flag"  # torch.fx._symbolic_trace's global, True while FX traces a module


def marker(start_index: int) -> Any:
    """A new native ``Marker``, or None while it is not built, or where it cannot be. The first call starts the
    build on a thread of its own; loading and the self-test run on the caller's.

    ``open()`` starts a step; ``mark(tensor, record)`` marks the tensor's autograd node for a record (a list;
    False where the tensor has no node); ``close()`` puts each reached mark's moment into its records at
    ``start_index`` (where None) and answers ``(ends of the step's backward passes, error message or "")``."""
    module = _BUILD.get()
    return None if module is None else module.Marker(start_index)


def lean_handler(marker: Any, layer: Any, fallback: Any, other_output: Any, fail: Any) -> Any:
    """A forward handler (see ``forward_wrappers``) for ``layer`` that measures the calls of a plain profiled step in
    C++, as the Python handler's lean path does, while ``marker.route(records, True)`` says so; with
    ``route(records, False)`` (a step that measures more) and while a trace or torch.profiler runs, each call goes
    to ``fallback``; with ``route(None, False)`` straight to the forward. ``other_output(record, output)`` notes an
    output that is not one plain tensor; ``fail(error)`` gets a fault of ours. None where it cannot be had here."""
    module = _BUILD.get()
    fx_module = torch.fx._symbolic_trace
    if module is None or not isinstance(getattr(fx_module, FX_FLAG, None), bool):
        return None
    return module.lean_handler(marker, layer, fallback, other_output, fail, vars(fx_module), FX_FLAG)


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
