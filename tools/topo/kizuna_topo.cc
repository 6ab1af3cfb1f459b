// kizuna-topo: direct-connect topology files — generate one, or check one; and the machine's own
// topology — detect it.
//
//   kizuna-topo --generate torus2d 4x4 [--bandwidth-gbps 100] [--latency-us 1] [--shaping] > t.json
//   kizuna-topo --generate ring 8 | full 4 | torus1d 8 | torus3d 2x2x2
//   kizuna-topo --generate ocs --workers 4 --worker-ports 2 [--aggregators 1 --aggregator-ports 4]
//               --map 'w0:0=w1:1,w1:0=w2:1,w2:0=w3:1,w3:0=w0:1'   (one command line)
//   kizuna-topo --check t.json
//   kizuna-topo detect [--xml server.xml] [--json out.json] [--check [--expect SWITCHES]]
//
// The output is the JSON format fabric/directconnect reads (KIZUNA_TOPOLOGY), one node or link per
// line. --check prints a summary, or the error naming the file and line, and exits 1.
//
// detect reads this machine with hwloc (or an hwloc XML file: another machine's `lstopo --of xml`)
// and prints the PCIe tree, the accelerator-to-NIC table (the NIC each accelerator's rank uses
// between hosts, and every NIC's distance class) and what operators trip on; with --check it exits
// 1 when it found any of those (runtime/topology/README.md).

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "fabric/directconnect/topology.h"
#include "runtime/topology/machine_topology.h"

namespace kizuna {
namespace {

using fabric::directconnect::Topology;

void PrintSummary(const Topology& t) {
  int aggregators = 0, ports = 0, unlinked = 0;
  for (size_t n = 0; n < t.nodes.size(); ++n) {
    aggregators += t.nodes[n].kind == fabric::directconnect::NodeKind::kAggregator ? 1 : 0;
    ports += t.nodes[n].ports;
    for (int p = 0; p < t.nodes[n].ports; ++p)
      unlinked += t.LinkAt(fabric::directconnect::PortRef{static_cast<int>(n), p}) == nullptr ? 1 : 0;
  }
  fmt::print("{}: {} worker(s), {} aggregator(s), {} port(s) ({} unconnected), {} link(s), shaping {}\n",
             t.Describe(), t.worker_count(), aggregators, ports, unlinked, t.links.size(), t.shaping ? "on" : "off");
  fmt::print("fingerprint {:016x}\n", t.Fingerprint());
}

// kizuna-topo detect: the machine's topology, its NIC table and findings.
int Detect(const std::string& xml, const std::string& json, bool check, int expect) {
  auto t = xml.empty() ? topology::Detect() : topology::LoadXml(xml);
  if (!t.ok()) {
    fmt::print(stderr, "kizuna-topo: {}\n", t.status().message());
    return 1;
  }
  fmt::print("{}\n{}", t->tree.empty() ? "(no accelerator or NIC on a PCI bus)\n" : t->tree,
             topology::DescribeAssignment(*t));
  if (!json.empty()) {
    std::FILE* f = std::fopen(json.c_str(), "w");
    const std::string text = topology::ToJson(*t, expect);
    if (f == nullptr || std::fputs(text.c_str(), f) < 0 || std::fclose(f) != 0) {
      fmt::print(stderr, "kizuna-topo: cannot write {}\n", json);
      return 1;
    }
  }
  if (!check) return 0;
  const std::vector<topology::Finding> findings = topology::Check(*t, expect);
  fmt::print("\n{} finding(s)\n", findings.size());
  for (const topology::Finding& f : findings) fmt::print("{}: {}\n", topology::FindingName(f.kind), f.message);
  return findings.empty() ? 0 : 1;
}

int Main(int argc, char** argv) {
  CLI::App app{"kizuna-topo: generate or check a direct-connect topology file (KIZUNA_TOPOLOGY)", "kizuna-topo"};
  std::vector<std::string> generate;
  std::string check, map, name;
  fabric::directconnect::LinkParams link;
  bool shaping = false;
  fabric::directconnect::OcsSpec ocs;
  app.add_option("--generate", generate,
                 "KIND SHAPE: ring N, torus1d N, torus2d XxY, torus3d XxYxZ, full N; or ocs (with --map)")
      ->expected(1, 2);
  app.add_option("--check", check, "validate a topology file and summarize it");
  app.add_option("--bandwidth-gbps", link.bandwidth_gbps, "per-link bandwidth per direction (0: unknown)")
      ->capture_default_str();
  app.add_option("--latency-us", link.latency_us, "per-link one-way latency (0: unknown)")->capture_default_str();
  app.add_flag("--shaping", shaping, "pace transfers to each link's bandwidth and latency");
  app.add_option("--name", name, "the topology's name (default: from the generator)");
  app.add_option("--workers", ocs.workers, "ocs: worker count");
  app.add_option("--worker-ports", ocs.worker_ports, "ocs: ports per worker");
  app.add_option("--aggregators", ocs.aggregators, "ocs: aggregation devices a0, a1, ...");
  app.add_option("--aggregator-ports", ocs.aggregator_ports, "ocs: ports per aggregation device");
  app.add_option("--map", map, "ocs: connected port pairs, 'w0:0=w1:1,w1:0=a0:2,...'");
  CLI::App* detect = app.add_subcommand("detect",
                                        "this machine's topology (hwloc): PCIe tree, accelerator-to-NIC "
                                        "table, findings");
  std::string xml, json;
  bool detect_check = false;
  int expect = -1;
  detect->add_option("--xml", xml, "an hwloc XML topology (lstopo --of xml) instead of this machine");
  detect->add_option("--json", json, "also write everything as JSON to this file");
  detect->add_flag("--check", detect_check, "report what operators trip on; exit 1 if anything was found");
  detect->add_option("--expect", expect, "with --check: the number of PCIe switches the machine should have");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports parse errors as exceptions; they end here, at the edge of the program.
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (detect->parsed()) return Detect(xml, json, detect_check, expect);
  if (generate.empty() == check.empty()) {
    fmt::print(stderr, "kizuna-topo: give exactly one of --generate KIND SHAPE or --check FILE (see --help)\n");
    return 2;
  }
  if (!check.empty()) {
    auto t = fabric::directconnect::LoadTopology(check);
    if (!t.ok()) {
      fmt::print(stderr, "kizuna-topo: {}\n", t.status().message());
      return 1;
    }
    PrintSummary(*t);
    return 0;
  }
  Result<Topology> t = Status(StatusCode::kInternal, "unset");
  if (generate[0] == "ocs") {
    if (generate.size() != 1) {
      fmt::print(stderr, "kizuna-topo: --generate ocs takes no shape; describe it with --workers, --worker-ports, "
                         "--aggregators, --aggregator-ports and --map\n");
      return 2;
    }
    auto pairs = fabric::directconnect::ParsePortMap(map);
    if (!pairs.ok()) {
      fmt::print(stderr, "kizuna-topo: --map: {}\n", pairs.status().message());
      return 2;
    }
    ocs.pairs = std::move(pairs).value();
    t = fabric::directconnect::GenerateOcs(ocs, link);
  } else {
    if (generate.size() != 2) {
      fmt::print(stderr, "kizuna-topo: --generate {} needs a shape (e.g. --generate torus2d 4x4)\n", generate[0]);
      return 2;
    }
    t = fabric::directconnect::GenerateNamed(generate[0], generate[1], link);
  }
  if (!t.ok()) {
    fmt::print(stderr, "kizuna-topo: {}\n", t.status().message());
    return 2;
  }
  t->shaping = shaping;
  if (!name.empty()) t->name = name;
  std::fputs(fabric::directconnect::TopologyToJson(*t).c_str(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
