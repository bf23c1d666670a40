// The collective ledger's bookkeeping: records are kept only while a ledger is open, each
// ledger gets those since it opened, and the line source names a record's source line
// (unless the record already has one), called only while a ledger is open.
#include "cc/spmd/ledger.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

CollectiveRecord Named(const std::string& kind, const std::string& line = "") {
  CollectiveRecord r;
  r.kind = kind;
  r.line = line;
  return r;
}

TEST(Ledger, KeepsRecordsOnlyWhileOpenAndNamesTheirLine) {
  int asked = 0;
  ledger::SetLineSource([&asked] {
    ++asked;
    return std::string("train.py:") + std::to_string(asked);
  });
  ledger::Record(Named("all-reduce"));  // no ledger open: dropped, the source not asked
  EXPECT_EQ(asked, 0);
  const int64_t outer = ledger::Begin();
  ledger::Record(Named("all-gather"));
  const int64_t inner = ledger::Begin();
  ledger::Record(Named("all-to-all", "model.py:7"));  // has a line: the source not asked
  std::vector<CollectiveRecord> got_inner = ledger::End(inner);
  std::vector<CollectiveRecord> got_outer = ledger::End(outer);
  ledger::SetLineSource(nullptr);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(got_inner.size(), 1u);
  EXPECT_EQ(got_inner[0].line, "model.py:7");
  EXPECT_EQ(got_outer.size(), 2u);
  EXPECT_EQ(got_outer[0].kind, "all-gather");
  EXPECT_EQ(got_outer[0].line, "train.py:1");
  EXPECT_EQ(got_outer[1].kind, "all-to-all");
  EXPECT_FALSE(ledger::Active());
  // Without a source, a record keeps an empty line.
  const int64_t again = ledger::Begin();
  ledger::Record(Named("all-reduce"));
  std::vector<CollectiveRecord> plain = ledger::End(again);
  EXPECT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].line, "");
}

TEST(Ledger, KeepsEachThreadsCollectivesInThatThreadsLedgers) {
  // Thread A and thread B each have a ledger open while both record: each gets its own.
  // A record from a thread with no ledger open (TensorFlow's executor threads) goes to
  // every open ledger.
  const int64_t mine = ledger::Begin();
  std::vector<CollectiveRecord> theirs;
  std::mutex mu;
  std::condition_variable cv;
  int step = 0;
  std::thread other([&] {
    const int64_t start = ledger::Begin();
    {
      std::unique_lock<std::mutex> lock(mu);
      step = 1;
      cv.notify_all();
      cv.wait(lock, [&] { return step == 2; });
    }
    ledger::Record(Named("all-gather"));
    {
      std::unique_lock<std::mutex> lock(mu);
      step = 3;
      cv.notify_all();
      cv.wait(lock, [&] { return step == 4; });
    }
    theirs = ledger::End(start);
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return step == 1; });
  }
  ledger::Record(Named("all-reduce"));
  std::thread([] { ledger::Record(Named("all-to-all")); }).join();  // no ledger of its own
  {
    std::unique_lock<std::mutex> lock(mu);
    step = 2;
    cv.notify_all();
    cv.wait(lock, [&] { return step == 3; });
    step = 4;
    cv.notify_all();
  }
  other.join();
  std::vector<CollectiveRecord> got = ledger::End(mine);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].kind, "all-reduce");
  EXPECT_EQ(got[1].kind, "all-to-all");
  ASSERT_EQ(theirs.size(), 2u);
  EXPECT_EQ(theirs[0].kind, "all-to-all");
  EXPECT_EQ(theirs[1].kind, "all-gather");
  EXPECT_FALSE(ledger::Active());
}

}  // namespace
}  // namespace tf_dtensor
