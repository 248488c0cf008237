/*
 * test_plan_api.cc - the plan API's contract without a GPU (maco/plan.h): verification of
 * files (valid, rejected, unreadable, not JSON, truncated reports) and the argument errors
 * of maco_plan_load, maco_plan_execute and maco_plan_destroy.
 */
#include <cstdio>
#include <cstring>
#include <string>

#include "maco_test.h"

#ifndef PLAN_DIR
#error "PLAN_DIR must name algorithms/plans"
#endif

namespace
{

using maco_test::AllowLog;

class PlanApi : public maco_test::Test
{
  protected:
    /* Writes `text` to a temporary file and returns its path. */
    std::string Temp(const std::string &text)
    {
        char path[] = "/tmp/maco-plan-api-XXXXXX";
        int fd = mkstemp(path);
        EXPECT_GE(fd, 0);
        FILE *f = fdopen(fd, "w");
        fputs(text.c_str(), f);
        fclose(f);
        temps_.push_back(path);
        return path;
    }
    void TearDown() override
    {
        for (const std::string &p : temps_)
            std::remove(p.c_str());
        maco_test::Test::TearDown();
    }
    std::vector<std::string> temps_;
};

TEST_F(PlanApi, ShippedPlanVerifies)
{
    char report[256] = "x";
    std::string path = std::string(PLAN_DIR) + "/allreduce_rsag_4r.json";
    ASSERT_EQ(maco_plan_verify_file(path.c_str(), report, sizeof(report)), MACO_OK) << report;
    EXPECT_STREQ(report, "");
    EXPECT_EQ(maco_plan_verify_file(path.c_str(), nullptr, 0), MACO_OK);
}

TEST_F(PlanApi, RejectedPlansSayWhy)
{
    char report[4096];
    EXPECT_EQ(maco_plan_verify_file("/nonexistent/plan.json", report, sizeof(report)),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(report, "cannot open"), nullptr) << report;

    std::string bad = Temp("{\"magic\": \"MACO-PLAN\", ");
    EXPECT_EQ(maco_plan_verify_file(bad.c_str(), report, sizeof(report)),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(report, "not valid JSON"), nullptr) << report;

    /* One rank that signals a channel its peer never waits on, and a wait that never returns. */
    std::string plan = Temp(R"({"magic": "MACO-PLAN", "version": 1, "name": "t",
      "collective": "allgather", "world_size": 2, "ranks_per_node": 2, "parts": 1,
      "scratch_chunks": 0, "ranks": [
      {"rank": 0, "channels": [{"type": "memory", "peer": 1}], "thread_blocks": [{"ops": [
        {"op": "copy", "src": {"buffer": "input", "index": 0}, "dst": {"buffer": "output", "index": 0}},
        {"op": "put", "channel": 0, "src": {"buffer": "input", "index": 0}, "dst": {"buffer": "output", "index": 0}},
        {"op": "wait", "channel": 0}]}]},
      {"rank": 1, "channels": [{"type": "memory", "peer": 0}], "thread_blocks": [{"ops": [
        {"op": "copy", "src": {"buffer": "input", "index": 0}, "dst": {"buffer": "output", "index": 1}},
        {"op": "put", "channel": 0, "src": {"buffer": "input", "index": 0}, "dst": {"buffer": "output", "index": 0}}]}]}]})");
    EXPECT_EQ(maco_plan_verify_file(plan.c_str(), report, sizeof(report)),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::strstr(report, "deadlock: rank 0 tb 0 op 2 (wait)"), nullptr) << report;

    /* A report buffer too small: cut, NUL-terminated. */
    char small[24];
    std::memset(small, 'z', sizeof(small));
    EXPECT_EQ(maco_plan_verify_file(plan.c_str(), small, sizeof(small)), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_LT(std::strlen(small), sizeof(small));
}

TEST_F(PlanApi, ArgumentErrors)
{
    char report[64];
    EXPECT_EQ(maco_plan_verify_file(nullptr, report, sizeof(report)), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_plan_verify_file("x.json", nullptr, 10), MACO_ERR_INVALID_ARGUMENT);
    AllowLog("maco_plan_load: comm is NULL");
    AllowLog("maco_plan_execute: plan is NULL");
    maco_plan_t plan = nullptr;
    EXPECT_EQ(maco_plan_load(nullptr, "x.json", &plan), MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(plan, nullptr);
    int x = 0;
    EXPECT_EQ(maco_plan_execute(nullptr, &x, &x, 1, MACO_INT32, MACO_SUM, nullptr, nullptr),
              MACO_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(maco_plan_destroy(nullptr), MACO_OK);
}

} // namespace
