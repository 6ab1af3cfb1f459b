// kizuna-bench's pieces that need no device: sizes and geometry as nccl-tests defines them, the
// check's values, reading the engine's choice line, and the output formats (the plot too).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "tools/bench/choice.h"
#include "tools/bench/plot.h"
#include "tools/bench/report.h"
#include "tools/bench/sweep.h"
#include "tools/bench/values.h"

namespace kizuna::bench {
namespace {

using collectives::Algorithm;

TEST(Sweep, SizesByFactorAndByStep) {
  auto s = SweepSizes(8, 64 << 10, 0, 2);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->size(), 14u);  // 8 B .. 64 KiB
  EXPECT_EQ(s->front(), 8u);
  EXPECT_EQ(s->back(), 64u << 10);
  s = SweepSizes(1000, 4000, 1000, 1);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (std::vector<uint64_t>{1000, 2000, 3000, 4000}));
  s = SweepSizes(32 << 20, 32 << 20, 1 << 20, 1);  // nccl-tests' default: one size
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->size(), 1u);
}

TEST(Sweep, EndlessOrHugeSweepsAreRefused) {
  EXPECT_FALSE(SweepSizes(0, 1024, 0, 2).ok());  // 0 * 2 stays 0
  EXPECT_FALSE(SweepSizes(8, 1024, 0, 1).ok());  // + 0 stays 8
  EXPECT_FALSE(SweepSizes(1, 1 << 30, 1, 1).ok());
  EXPECT_FALSE(SweepSizes(64, 8, 1, 2).ok());
  EXPECT_TRUE(SweepSizes(0, 0, 0, 2).ok());
}

TEST(Sweep, ParseByteSize) {
  EXPECT_EQ(*ParseByteSize("8", "-b"), 8u);
  EXPECT_EQ(*ParseByteSize("64K", "-b"), 64u << 10);
  EXPECT_EQ(*ParseByteSize("1M", "-b"), 1u << 20);
  EXPECT_EQ(*ParseByteSize("2g", "-b"), uint64_t{2} << 30);
  auto bad = ParseByteSize("12X", "-e");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("-e '12X'"), std::string::npos);
  EXPECT_FALSE(ParseByteSize("", "-b").ok());
  EXPECT_FALSE(ParseByteSize("2048T", "-b").ok());
}

TEST(Sweep, GeometryAsNcclTests) {
  // 4 ranks, 1000 float32 requested bytes = 250 elements.
  Geometry g = GeometryFor(BenchColl::kAllReduce, 1000, DataType::kFloat32, 4);
  EXPECT_EQ(g.count, 250u);
  EXPECT_EQ(g.size_bytes(), 1000u);
  g = GeometryFor(BenchColl::kReduceScatter, 1000, DataType::kFloat32, 4);
  EXPECT_EQ(g.count, 62u);
  EXPECT_EQ(g.send_count, 248u);
  EXPECT_EQ(g.recv_count, 62u);
  EXPECT_EQ(g.size_bytes(), 992u);
  EXPECT_EQ(g.in_place_recv_count(3), 248u);  // output at 3 * 62, input from 0
  g = GeometryFor(BenchColl::kAllGather, 1000, DataType::kFloat32, 4);
  EXPECT_EQ(g.count, 62u);
  EXPECT_EQ(g.send_count, 62u);
  EXPECT_EQ(g.recv_count, 248u);
  EXPECT_EQ(g.send_offset, 62u);
  g = GeometryFor(BenchColl::kAllToAll, 1000, DataType::kFloat32, 4);
  EXPECT_EQ(g.count, 62u);
  EXPECT_FALSE(g.in_place);
  g = GeometryFor(BenchColl::kSendRecv, 8, DataType::kFloat64, 2);
  EXPECT_EQ(g.count, 1u);
  EXPECT_FALSE(g.in_place);
}

TEST(Sweep, BusBwFactorsAndNames) {
  EXPECT_DOUBLE_EQ(BusBwFactor(BenchColl::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(BusBwFactor(BenchColl::kReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(BusBwFactor(BenchColl::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(BusBwFactor(BenchColl::kAllToAll, 4), 0.75);
  EXPECT_DOUBLE_EQ(BusBwFactor(BenchColl::kBroadcast, 4), 1);
  EXPECT_DOUBLE_EQ(BusBwFactor(BenchColl::kReduce, 4), 1);
  EXPECT_DOUBLE_EQ(BusBwFactor(BenchColl::kSendRecv, 4), 1);
  EXPECT_EQ(ParseBenchColl("all_reduce"), BenchColl::kAllReduce);
  EXPECT_EQ(ParseBenchColl("ReduceScatter"), BenchColl::kReduceScatter);
  EXPECT_EQ(ParseBenchColl("sendrecv"), BenchColl::kSendRecv);
  EXPECT_FALSE(ParseBenchColl("sum"));  // the reductions' names are not collectives
  EXPECT_EQ(NcclTypeName(DataType::kFloat32), "float");
  EXPECT_EQ(NcclTypeName(DataType::kFloat16), "half");
}

// The reduction of every rank's input, computed here the slow way, equals ReducedPattern, and
// both are exact: the same value in every type.
TEST(Values, ReducedPatternIsTheReductionOfTheInputs) {
  for (int n : {1, 2, 3, 4, 7, 8, 9, 16, 33}) {
    for (ReduceOp op : AllReduceOps()) {
      for (DataType t : AllDataTypes()) {
        const Pattern reduced = ReducedPattern(op, t, n);
        std::vector<Pattern> inputs;
        for (int q = 0; q < n; ++q) inputs.push_back(InputPattern(BenchColl::kAllReduce, op, t, n, q));
        for (uint64_t i = 0; i < 500; ++i) {
          double acc = inputs[0].value(i);
          for (int q = 1; q < n; ++q) {
            const double v = inputs[static_cast<size_t>(q)].value(i);
            if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
            if (op == ReduceOp::kProd) acc *= v;
            if (op == ReduceOp::kMin) acc = std::min(acc, v);
            if (op == ReduceOp::kMax) acc = std::max(acc, v);
          }
          ASSERT_LE(acc, 97) << "n=" << n;
          if (op == ReduceOp::kAvg) {
            const double want = reduced.value(i);
            ASSERT_NEAR(want, acc / n, IsFloatingPoint(t) ? 0.01 * acc / n + 1e-12 : 1.0) << "n=" << n << " i=" << i;
          } else {
            ASSERT_EQ(reduced.value(i), acc) << "n=" << n << " i=" << i << " " << ReduceOpName(op);
          }
          // The value survives the trip through the type.
          std::vector<uint8_t> buf(8);
          StoreElement(buf.data(), 0, t, acc);
          if (op != ReduceOp::kAvg) {
            ASSERT_EQ(LoadElement(buf.data(), 0, t), acc) << DataTypeName(t);
          }
        }
      }
    }
  }
}

TEST(Values, RanksDifferInTheDataTheyMove) {
  const Pattern a = InputPattern(BenchColl::kAllGather, ReduceOp::kSum, DataType::kInt8, 8, 2);
  const Pattern b = InputPattern(BenchColl::kAllGather, ReduceOp::kSum, DataType::kInt8, 8, 3);
  for (uint64_t i = 0; i < 1000; ++i) {
    EXPECT_NE(a.value(i), b.value(i));
    EXPECT_NE(a.value(i), a.value(i + 1));
  }
}

TEST(Values, WriteAndCountWrongAtAnyPhase) {
  const Pattern p = InputPattern(BenchColl::kBroadcast, ReduceOp::kSum, DataType::kFloat32, 4, 1);
  std::vector<float> buf(20000);
  p.Write(buf.data(), 12345, buf.size());
  for (uint64_t k = 0; k < buf.size(); k += 777) EXPECT_EQ(buf[k], p.value(12345 + k));
  EXPECT_EQ(p.CountWrong(buf.data(), 12345, buf.size(), 0), 0u);
  EXPECT_EQ(p.CountWrong(buf.data(), 12346, buf.size(), 0), buf.size());  // shifted by one: all wrong
  buf[7] = 1000;
  std::memset(&buf[19000], kPoisonByte, 10 * sizeof(float));  // unwritten (poisoned) elements
  EXPECT_EQ(p.CountWrong(buf.data(), 12345, buf.size(), 0), 11u);
  EXPECT_EQ(p.CountWrong(buf.data(), 12345, 0, 0), 0u);
}

TEST(Values, AvgToleranceAcceptsOneRoundingOnly) {
  const Pattern avg = ReducedPattern(ReduceOp::kAvg, DataType::kFloat32, 3);
  std::vector<float> buf(100);
  avg.Write(buf.data(), 0, buf.size());
  const double tol = OutputTolerance(ReduceOp::kAvg, DataType::kFloat32);
  EXPECT_GT(tol, 0);
  buf[5] = std::nextafter(buf[5], 1e9f);
  EXPECT_EQ(avg.CountWrong(buf.data(), 0, buf.size(), tol), 0u);
  buf[6] += 0.5f;
  EXPECT_EQ(avg.CountWrong(buf.data(), 0, buf.size(), tol), 1u);
  EXPECT_EQ(OutputTolerance(ReduceOp::kSum, DataType::kFloat32), 0);
  EXPECT_EQ(OutputTolerance(ReduceOp::kAvg, DataType::kInt32), 0);
}

TEST(Choice, ReadsTheSelectionLine) {
  auto c = ParseChoice(
      "allreduce count=1024 float32 sum nranks=4: rd (predicted 22.8 us) chosen by the model; ring 66.1 us, "
      "tree 54.4 us, rhd 1.2 ms, pairwise inf, p2p not supported (p2p does not implement allreduce), fused not "
      "supported (fused needs ranks that address each other's buffers directly (ranks of one process on one "
      "device, or on devices that reach each other's memory))");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->chosen, Algorithm::kRd);
  ASSERT_NE(c->Find(Algorithm::kRd), nullptr);
  EXPECT_NEAR(*c->Find(Algorithm::kRd)->predicted_s, 22.8e-6, 1e-12);
  EXPECT_NEAR(*c->Find(Algorithm::kRing)->predicted_s, 66.1e-6, 1e-12);
  EXPECT_NEAR(*c->Find(Algorithm::kRhd)->predicted_s, 1.2e-3, 1e-12);
  EXPECT_TRUE(c->Find(Algorithm::kPairwise)->supported);
  EXPECT_FALSE(c->Find(Algorithm::kPairwise)->predicted_s);
  EXPECT_FALSE(c->Find(Algorithm::kP2p)->supported);
  EXPECT_EQ(c->Supported(), (std::vector<Algorithm>{Algorithm::kRing, Algorithm::kTree, Algorithm::kRhd, Algorithm::kRd,
                                                    Algorithm::kPairwise}));
  EXPECT_EQ(c->Used(std::nullopt), Algorithm::kRd);
  EXPECT_EQ(c->Used(Algorithm::kTree), Algorithm::kTree);
  // A forced algorithm that cannot serve the call: the model's cheapest.
  EXPECT_EQ(c->Used(Algorithm::kP2p), Algorithm::kRd);
}

TEST(Choice, ForcedByKizunaAlgoAndMalformedLines) {
  auto c = ParseChoice(
      "reducescatter count=8 float32 sum nranks=4: ring (predicted 9.5 us) KIZUNA_ALGO=tree cannot serve "
      "reducescatter: tree does not implement reducescatter; using ring; tree not supported (tree does not "
      "implement reducescatter), rhd 8.1 us");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->chosen, Algorithm::kRing);
  EXPECT_FALSE(c->Find(Algorithm::kTree)->supported);
  EXPECT_NEAR(*c->Find(Algorithm::kRhd)->predicted_s, 8.1e-6, 1e-12);
  EXPECT_EQ(c->Used(Algorithm::kTree), Algorithm::kRhd);  // the model alone prefers rhd
  EXPECT_FALSE(ParseChoice("garbage").ok());
  EXPECT_FALSE(ParseChoice("x: nosuch (predicted 1 us) chosen").ok());
}

TEST(Report, RowFormatsAsNcclTests) {
  Row row;
  row.size_bytes = 1024;
  row.count = 256;
  row.type = "float";
  row.redop = "sum";
  row.root = -1;
  row.algo = "ring";
  row.requested = "auto";
  row.predicted_s = 12.5e-6;
  row.out_of_place = Measure(1024, 20e-6, 1.5, 0);
  row.in_place = std::nullopt;
  const std::string line = TableRow(row);
  EXPECT_EQ(line,
            "        1024           256     float     sum      -1    20.00    0.05    0.08      0      N/A     N/A     "
            "N/A    N/A  ring        12.50\n");
  Totals t;
  t.Add(row);
  EXPECT_EQ(Footer(t), "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0.0768\n#\n");
  row.in_place = Measure(1024, 200e-6, 1.5, 3);
  t.Add(row);
  EXPECT_EQ(t.failed_measurements, 1u);
  EXPECT_NE(Footer(t).find("FAILED"), std::string::npos);
  EXPECT_NE(Footer(Totals{}, /*stopped=*/true).find("0 FAILED (the run stopped at an error)"), std::string::npos);
  EXPECT_EQ(FormatMicros(123.456e-6), "  123.5");
  EXPECT_EQ(FormatMicros(12345.6e-6), "  12346");
  EXPECT_EQ(CsvRow(row), "1024,256,float,sum,-1,ring,auto,12.5,20,0.0512,0.0768,0,200,0.00512,0.00768,3\n");
  EXPECT_EQ(JsonRow(row)["in_place"]["wrong"], 3);
}

TEST(Plot, ALinePerAlgorithmWithItsPrediction) {
  std::vector<Row> rows;
  for (const char* algo : {"ring", "fused"})
    for (uint64_t size : {1024u, 4096u, 0u}) {
      Row r;
      r.size_bytes = size;
      r.type = "float";
      r.redop = "sum";
      r.algo = r.requested = algo;
      r.predicted_s = size * 1e-9;  // 1 GB/s algbw
      r.out_of_place = Measure(size, size * 2e-9, 1.5, 0);
      rows.push_back(r);
    }
  rows.back().predicted_s.reset();  // a row without a prediction still plots its measurement
  const std::string svg = PlotSvg(rows, 1.5, "a <title> & more");
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_NE(svg.find("a &lt;title&gt; &amp; more"), std::string::npos);
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = svg.find(what); at != std::string::npos; at = svg.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("class=\"measured\""), 2u);
  EXPECT_EQ(count("class=\"predicted\""), 2u);
  EXPECT_EQ(count("<circle"), 4u);  // size 0 has no place on a log axis
  EXPECT_EQ(count(">ring</text>"), 1u);
  EXPECT_EQ(count(">fused</text>"), 1u);
  EXPECT_NE(svg.find(">1 KiB</text>"), std::string::npos);
  EXPECT_NE(svg.find(">4 KiB</text>"), std::string::npos);
  // Several types name them in the legend.
  rows[0].type = "half";
  const std::string typed = PlotSvg(rows, 1.5, "t");
  EXPECT_NE(typed.find(">ring half</text>"), std::string::npos);
  EXPECT_NE(typed.find(">ring float</text>"), std::string::npos);
  // Nothing to plot is still a valid picture, saying so.
  EXPECT_NE(PlotSvg({}, 1, "t").find("no measurements"), std::string::npos);
}

}  // namespace
}  // namespace kizuna::bench
