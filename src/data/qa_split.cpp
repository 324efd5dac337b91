// prepare --test-ids: the held-out examples are those of a list of ids (PubMedQA's official test
// ids), so that a score on those ids is never a score on trained records.
#include <map>
#include <set>

#include "llamatrain/error.h"
#include "llamatrain/prepare.h"
#include "llamatrain/qa.h"

namespace lt {

void check_listed_ids_present(const IdList& list, const std::string& list_path, const std::vector<QaRecord>& records,
                              const std::string& records_path) {
  std::set<std::string> have;
  for (const QaRecord& r : records) have.insert(r.id);
  std::vector<std::string> missing;
  for (const std::string& id : list.ids)
    if (have.count(id) == 0) missing.push_back(id);
  if (missing.empty()) return;
  fail(strcat(list_path, ": ", missing.size(), " of the ", list.ids.size(), " listed ids are not among the ",
              records.size(), " records read from ", records_path, ", e.g. ", quoted_ids(missing)));
}

void split_examples_by_ids(std::vector<QaExample> examples, const IdList& list, std::vector<QaExample>* train,
                           std::vector<QaExample>* test, TestIdsReport* report) {
  std::map<std::string, bool> listed;  // id -> has an example in test
  for (const std::string& id : list.ids) listed[id] = false;
  for (QaExample& e : examples) {
    const auto it = listed.find(e.id);
    if (it == listed.end()) {
      train->push_back(std::move(e));
      continue;
    }
    it->second = true;
    test->push_back(std::move(e));
  }
  *report = TestIdsReport{};
  report->listed = int64_t(list.ids.size());
  for (const std::string& id : list.ids) {
    if (listed[id]) {
      ++report->in_test;
    } else {
      ++report->dropped;
      report->dropped_ids.push_back(id);
    }
  }
}

}  // namespace lt
