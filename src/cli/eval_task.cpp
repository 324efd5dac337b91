// `llamatrain eval --task pubmedqa`: the records to score (--qa, restricted to --ids), the prompt
// format and answer field they are scored in (the --ids dataset's unless given, and never one that
// differs from it), the refusal to score ids the model was trained on, and the report.
#include "cli/eval_task.h"

#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "cli/common.h"
#include "llamatrain/checkpoint.h"
#include "llamatrain/dataset.h"
#include "llamatrain/device.h"
#include "llamatrain/error.h"
#include "llamatrain/fsutil.h"
#include "llamatrain/h5.h"
#include "llamatrain/prepare.h"
#include "llamatrain/progress.h"
#include "llamatrain/qa.h"
#include "llamatrain/qa_eval.h"
#include "llamatrain/runtime.h"

namespace lt::cli {
namespace {

struct TaskInput {
  std::vector<QaRecord> records;
  std::optional<DatasetInfo> ids_data;  // --ids named a dataset made by prepare
};

// The records to score: --qa, restricted to --ids (whose labels, when given, are the truth).
TaskInput task_input(const EvalOptions& opt) {
  if (opt.qa.empty()) fail("eval --task: --qa FILE is required");
  QaReadReport report;
  TaskInput in;
  in.records = load_qa_records(opt.qa, QaReadOptions{}, &report);
  if (opt.ids.empty()) return in;
  std::map<std::string, std::string> wanted;  // id -> label ("" keeps the record's own)
  if (h5::is_hdf5_file(opt.ids)) {
    const Dataset ds = Dataset::load(opt.ids);
    if (ds.test.examples.empty()) fail(strcat(opt.ids, ": the dataset has no test examples with ids"));
    for (const auto& e : ds.test.examples) wanted[e.id] = "";
    in.ids_data = ds.info;
  } else {
    const IdList list = read_id_file(opt.ids);
    for (size_t i = 0; i < list.ids.size(); ++i) wanted[list.ids[i]] = list.labels[i];
  }
  std::vector<QaRecord> out;
  for (auto& r : in.records) {
    auto it = wanted.find(r.id);
    if (it == wanted.end()) continue;
    if (!it->second.empty()) r.label = it->second;
    out.push_back(std::move(r));
    wanted.erase(it);
  }
  if (!wanted.empty())
    fail(strcat(opt.ids, ": ", wanted.size(), " id(s) not found in ", opt.qa, ", e.g. '", wanted.begin()->first, "'"));
  in.records = std::move(out);
  return in;
}

// The prompt format a dataset was prepared with; files older than prompt_format have prompt_type.
PromptFormat dataset_format(const DatasetInfo& info, const std::string& path) {
  if (!info.prompt_format.empty()) {
    try {
      return PromptFormat::parse(info.prompt_format);
    } catch (const Error& e) {
      fail(strcat(path, ": attribute prompt_format: ", e.what()));
    }
  }
  if (info.prompt_type >= 1 && info.prompt_type <= 3) return PromptFormat::from_prompt_type(info.prompt_type);
  fail(strcat(path, ": the dataset records no prompt format (plain text?)"));
}

// The format and answer field: the options' where given, else the --ids dataset's, else
// --prompt-type 1 and long_answer. An option that differs from the dataset's is refused.
QaEvalOptions task_eval_options(const EvalOptions& opt, const std::optional<PromptFormat>& given_format,
                                const std::optional<DatasetInfo>& data) {
  QaEvalOptions q;
  const std::string keep = "; leave the option out to score as the data was prepared";
  if (data) {
    q.format = dataset_format(*data, opt.ids);
    q.answer_field = parse_answer_field(data->answer_field.empty() ? "long_answer" : data->answer_field);
  }
  if (given_format) {
    const PromptFormat& given = *given_format;
    if (data && given != q.format)
      fail(strcat("eval --task: the prompt format given, ", given.to_string(), ", differs from ", q.format.to_string(),
                  " that ", opt.ids, " was prepared with", keep));
    q.format = given;
  }
  if (!opt.answer_field.empty()) {
    const AnswerField given = parse_answer_field(opt.answer_field);
    if (data && given != q.answer_field)
      fail(strcat("eval --task: --answer-field ", opt.answer_field, " differs from ", answer_field_name(q.answer_field),
                  " that ", opt.ids, " was prepared with", keep));
    q.answer_field = given;
  }
  return q;
}

// Why the training data of `training` cannot be checked ("" when it can), and its train ids.
std::string trained_ids_of(const TrainingRecord& training, std::set<std::string>* ids) {
  const std::string& path = training.data_path;
  if (path.empty()) return "the model's training record names no dataset";
  if (!file_exists(path)) return strcat("its training data ", path, " is absent");
  try {
    if (!h5::File::open_read(path).exists("/train/examples/ids")) return "";  // text: no record ids
    const Dataset ds = Dataset::load(path);
    if (dataset_identity(ds) != training.data_identity)
      return strcat("its training data ", path, " has changed since (now ", dataset_identity(ds), "; trained on ",
                    training.data_identity, ")");
    for (const auto& e : ds.train.examples) ids->insert(e.id);
  } catch (const Error& e) {
    return strcat("its training data ", path, " cannot be read: ", e.what());
  }
  return "";
}

// Refuses to score ids of the model's train split (--allow-trained-ids: a warning); a note when
// the model's training data cannot be checked.
void check_trained_ids(const LoadedModel& m, const EvalOptions& opt, const std::vector<QaRecord>& records) {
  if (!m.training) {  // not made by train: nothing it was trained on is known
    if (!opt.ids.empty())
      std::fprintf(stderr, "eval: note: trained ids not checked: %s records no training (a llama2.c or Hugging "
                   "Face model, or a checkpoint saved before training records were kept), so the ids of --ids may "
                   "be among those it was trained on\n", opt.model.c_str());
    return;
  }
  std::set<std::string> trained;
  const std::string why = trained_ids_of(*m.training, &trained);
  if (!why.empty()) {
    std::fprintf(stderr, "eval: note: trained ids not checked: %s\n", why.c_str());
    return;
  }
  std::vector<std::string> overlap;
  for (const QaRecord& r : records)
    if (trained.count(r.id) > 0) overlap.push_back(r.id);
  if (overlap.empty()) return;
  const std::string what = strcat(overlap.size(), " of the ", records.size(), " ids to score are in the train split of ",
                                  m.training->data_path, ", which ", opt.model, " was trained on (", quoted_ids(overlap),
                                  ")");
  if (!opt.allow_trained_ids)
    fail(strcat("eval --task ", opt.task, ": ", what, "; their score is not a held-out score. Prepare with --test-ids ",
                "to hold them out, or pass --allow-trained-ids to score them anyway"));
  std::fprintf(stderr, "eval: warning: %s; scored anyway (--allow-trained-ids)\n", what.c_str());
}

void print_task_result(const EvalOptions& opt, const QaEvalResult& r) {
  if (opt.json) {
    std::printf("%s\n", r.to_json().c_str());
    return;
  }
  std::printf("%s: %lld examples, accuracy %.4f, macro-F1 %.4f (skipped %lld, %lld of them too long; contexts "
              "truncated %lld)\n",
              opt.task.c_str(), (long long)r.examples, r.accuracy, r.macro_f1, (long long)r.skipped,
              (long long)r.too_long, (long long)r.truncated);
  if (r.generated)
    std::printf("long answers generated first: %lld tokens, \"Final decision:\" reached in %lld of %lld\n",
                (long long)r.generated_tokens, (long long)r.lead_found, (long long)r.examples);
  std::printf("confusion (rows: truth, columns: predicted yes/no/maybe):\n");
  const char* names[3] = {"yes", "no", "maybe"};
  for (int t = 0; t < 3; ++t)
    std::printf("  %-5s %6lld %6lld %6lld\n", names[t], (long long)r.confusion[size_t(t)][0],
                (long long)r.confusion[size_t(t)][1], (long long)r.confusion[size_t(t)][2]);
}

}  // namespace

int run_eval_task(const EvalOptions& opt) {
  // The options' format is checked before any loading.
  std::optional<PromptFormat> given_format;
  if (opt.prompt.given()) given_format = prompt_format_of(opt.prompt);
  LoadedModel loaded = load_model_and_tokenizer("eval", opt.model, opt.tokenizer);
  // The answers' decoder and the scorer read the same weights: the adapter merged into them.
  if (!opt.lora.empty()) merge_lora_dir("eval", opt.lora, loaded.model.config(), loaded.model.params());
  const std::unique_ptr<Evaluator> scorer =
      evaluator_on("eval", opt.device, loaded.model, opt.precision);
  const TaskInput in = task_input(opt);
  const QaEvalOptions qopt = task_eval_options(opt, given_format, in.ids_data);
  // --answer-field both: the long answers written on the scorer's device.
  std::unique_ptr<Decoder> writer;
  if (qopt.answer_field == AnswerField::kBoth)
    writer = make_decoder(resolve_device(opt.device), loaded.model, loaded.model.config().max_seq_len, world().local_rank);
  check_trained_ids(loaded, opt, in.records);
  const std::string from = in.ids_data ? " (as " + opt.ids + " was prepared)" : "";
  std::fprintf(stderr, "eval: %zu records, prompt format %s, answers %s%s\n", in.records.size(),
               qopt.format.name().c_str(), answer_field_name(qopt.answer_field), from.c_str());
  Progress progress = eval_progress(opt, "eval " + opt.task, int64_t(in.records.size()), "records");
  const QaEvalResult r = evaluate_yes_no_maybe(*scorer, loaded.model, loaded.tokenizer, in.records, qopt,
                                               [&](int64_t done) { progress.update(done); }, writer.get());
  progress.finish();
  if (r.examples == 0 && r.too_long > 0)
    fail(strcat("eval --task ", opt.task, ": none of ", in.records.size(), " records was scored: ", r.too_long,
                " do not fit the model's max_seq_len ", loaded.model.config().max_seq_len, " even without context",
                qopt.answer_field == AnswerField::kBoth ? " and with room for the long answer" : "", ", the others have no "
                "yes/no/maybe label"));
  if (r.examples == 0)
    fail(strcat("eval --task ", opt.task, ": none of ", in.records.size(), " records has a yes/no/maybe label"));
  print_task_result(opt, r);
  return 0;
}

}  // namespace lt::cli
