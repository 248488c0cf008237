/*
 * errors.cpp - the capture of MACO's ERROR lines and StatusError (errors.h).
 */
#include "errors.h"

#include <utility>

namespace maco_py
{

namespace
{

/* The ERROR lines MACO logs on this thread while a call of this module runs. MACO holds them
 * back from its log during the call (maco_log_set_error_capture), so that an error appears
 * once: in the exception raised for the call. Lines the exception does not carry are written to
 * the log when the call ends (Capture's destructor). */
thread_local std::vector<std::string> tl_error_lines;
thread_local bool tl_capturing = false;
thread_local bool tl_raised = false; /* the first captured line went into an exception */

/* "host:pid:tid [rank] ERROR subsys: text (status)\n" -> "text (status)", and its subsystem. */
std::string strip_log_prefix(const std::string &line, std::string *subsys = nullptr)
{
    std::string text = line;
    size_t at = text.find("] ERROR ");
    if (at != std::string::npos) {
        size_t colon = text.find(": ", at);
        if (colon != std::string::npos) {
            if (subsys != nullptr)
                *subsys = text.substr(at + 8, colon - (at + 8));
            text = text.substr(colon + 2);
        }
    }
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r'))
        text.pop_back();
    return text;
}

} // namespace

void log_handler(maco_log_level_t level, const char *line, void *)
{
    if (level != MACO_LOG_ERROR || !tl_capturing || line == nullptr)
        return;
    tl_error_lines.emplace_back(line);
}

Capture::Capture()
    : saved_lines_(std::move(tl_error_lines)), saved_capturing_(tl_capturing),
      saved_raised_(tl_raised), saved_mode_(maco_log_set_error_capture(1))
{
    tl_error_lines.clear();
    tl_capturing = true;
    tl_raised = false;
}

Capture::~Capture()
{
    maco_log_set_error_capture(saved_mode_);
    tl_capturing = false;
    for (size_t i = tl_raised ? 1 : 0; i < tl_error_lines.size(); i++) {
        std::string subsys;
        std::string text = strip_log_prefix(tl_error_lines[i], &subsys);
        maco_log_write(MACO_LOG_ERROR, subsys.c_str(), "%s", text.c_str());
    }
    tl_error_lines = std::move(saved_lines_);
    tl_capturing = saved_capturing_;
    tl_raised = saved_raised_;
}

[[noreturn]] void raise_status(maco_status_t st, maco_comm_t comm, const char *call)
{
    std::string msg;
    if (tl_capturing && !tl_error_lines.empty()) {
        msg = strip_log_prefix(tl_error_lines.front());
        tl_raised = true;
    }
    if (msg.empty() && comm != nullptr)
        msg = maco_comm_get_last_error(comm);
    if (msg.empty())
        msg = maco_log_last_error(); /* errors that leave the communicator usable */
    if (msg.empty())
        msg = std::string(call) + ": " + maco_status_string(st);
    throw StatusError{ static_cast<int>(st), msg };
}

} // namespace maco_py
