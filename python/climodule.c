/*
 * `pinpool._cli`: the command-line tool (tools/) compiled into the Python
 * package, so that `python3 -m pinpool ARGS` runs the very tool that
 * `pinpool ARGS` runs, with the library the package was built with
 * (docs/python.md, "The command-line tool"). A module of its own, not part
 * of pinpool._core: only the tool needs libjansson, and `import pinpool`
 * should not load it.
 *
 * main(argv) runs cli_main with the GIL released (the demo runs for
 * seconds, with threads of its own). The tool writes with C stdio: Python's
 * buffered sys.stdout and sys.stderr are flushed before, C's after, so
 * that the output keeps its order. The demo installs its own SIGINT
 * handler for the run and restores Python's after it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

static int flush_python_stream(const char *name) {
  PyObject *f = PySys_GetObject(name); /* borrowed */
  if (f == NULL || f == Py_None)
    return 0;
  PyObject *r = PyObject_CallMethod(f, "flush", NULL);
  if (r == NULL)
    return -1;
  Py_DECREF(r);
  return 0;
}

static PyObject *cli_run(PyObject *m, PyObject *arg) {
  (void)m;
  if (!PyList_Check(arg) && !PyTuple_Check(arg)) {
    PyErr_Format(PyExc_TypeError,
                 "argv must be a list of str (program name first), not %.100s",
                 Py_TYPE(arg)->tp_name);
    return NULL;
  }
  PyObject *seq = PySequence_Fast(arg, "argv must be a sequence");
  if (seq == NULL)
    return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n < 1) {
    Py_DECREF(seq);
    PyErr_SetString(PyExc_ValueError, "argv must hold the program name");
    return NULL;
  }
  /* The encoded arguments stay referenced (bytes objects) for the run. */
  PyObject *bytes = PyList_New(n);
  char **argv = PyMem_Calloc((size_t)n + 1, sizeof *argv);
  PyObject *result = NULL;
  if (bytes == NULL || argv == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &b))
      goto done;
    PyList_SET_ITEM(bytes, i, b);
    argv[i] = PyBytes_AS_STRING(b);
  }
  if (flush_python_stream("stdout") != 0 || flush_python_stream("stderr") != 0)
    goto done;
  PyThreadState *ts = PyEval_SaveThread();
  int rc = cli_main((int)n, argv);
  fflush(stdout);
  fflush(stderr);
  PyEval_RestoreThread(ts);
  result = PyLong_FromLong(rc);
done:
  PyMem_Free(argv);
  Py_XDECREF(bytes);
  Py_DECREF(seq);
  return result;
}

static PyMethodDef cli_methods[] = {
    {"main", cli_run, METH_O,
     "main(argv, /)\n--\n\n"
     "Run the pinpool command-line tool with argv (a list of str, the\n"
     "program name first) in this process and return its exit status (0\n"
     "success, 1 failure, 2 usage error). The GIL is released while it\n"
     "runs. Raises TypeError or ValueError for a malformed argv."},
    {NULL, NULL, 0, NULL}};

static PyModuleDef_Slot cli_slots[] = {
#if PY_VERSION_HEX >= 0x030C0000
    /* The tool's process-wide state: a SIGINT handler and its flag. */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
#if PY_VERSION_HEX >= 0x030D0000
    /* No Python state at all: the tool is C with its own threads. */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL}};

static struct PyModuleDef cli_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pinpool._cli",
    .m_doc = "The pinpool command-line tool, run in-process (python3 -m "
             "pinpool).",
    .m_size = 0,
    .m_methods = cli_methods,
    .m_slots = cli_slots,
};

PyMODINIT_FUNC PyInit__cli(void);
PyMODINIT_FUNC PyInit__cli(void) { return PyModuleDef_Init(&cli_module); }
