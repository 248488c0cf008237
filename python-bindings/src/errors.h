/*
 * errors.h - how a failing MACO call becomes a Python exception in the extension maco._maco.
 *
 * While a call of the module runs, the ERROR lines MACO logs on the calling thread are captured
 * (Capture) and held back from MACO's log (maco_log_set_error_capture), so that an error
 * appears once: raise_status() throws a StatusError carrying the first captured line, else the
 * communicator's first error, else MACO's last error, else the status text; the module's
 * exception translator (module.cpp) turns it into the package's exception for the status
 * (maco/_errors.py). Lines no exception carries are written to the log when the call ends.
 */
#ifndef MACO_PY_ERRORS_H
#define MACO_PY_ERRORS_H

#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include <maco/maco.h>

namespace maco_py
{

namespace nb = nanobind;

/* A failed MACO status and its message; translated into maco._errors' exception. */
struct StatusError {
    int status;
    std::string message;
};

/* The log handler installed at import (maco_log_set_handler): keeps the ERROR lines of the
 * current thread's running call. */
void log_handler(maco_log_level_t level, const char *line, void *);

/* One call's capture: nested captures (a call made while another is reported) keep theirs.
 * Not copyable; lives on the stack of the call. */
class Capture
{
  public:
    Capture();
    /* Writes the lines no exception carries, then restores the outer capture. */
    ~Capture();
    Capture(const Capture &) = delete;
    Capture &operator=(const Capture &) = delete;

  private:
    std::vector<std::string> saved_lines_;
    bool saved_capturing_;
    bool saved_raised_;
    int saved_mode_;
};

/* Throws StatusError for `st` (the message as the file's comment says); `comm` may be NULL,
 * `call` names the C function for the last resort. */
[[noreturn]] void raise_status(maco_status_t st, maco_comm_t comm, const char *call);

/* Runs f() (a MACO call returning maco_status_t) without the GIL and raises on a failed
 * status. */
template <class F> void checked(const char *call, maco_comm_t comm, F &&f)
{
    Capture capture;
    maco_status_t st;
    {
        nb::gil_scoped_release release;
        st = f();
    }
    if (st != MACO_OK)
        raise_status(st, comm, call);
}

} // namespace maco_py

#endif /* MACO_PY_ERRORS_H */
