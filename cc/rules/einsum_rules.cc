// Einsum: each letter of the equation is one factor (factor.h).
//   a letter in the output and the inputs: pass-through, its sharding reaches the output
//     "bmk,bkn->bmn": [x,*,*] [*,*,*] -> [x,*,*]          (b sharded: local)
//   a letter only in the inputs: contracted, a sharded one leaves partial sums
//     "bmk,bkn->bmn": [*,*,x] [*,x,*] -> partial(x) -> all-reduce -> [*,*,*]
//     "ij->":         [x,y] -> partial(x,y) -> all-reduce -> []
//   a letter repeated within one operand or the output (a diagonal, "ii->i", "i->ii"):
//     need-replication, the diagonal's elements do not line up with shards, so those
//     axes are gathered (and written replicated).
//   "...": one factor per broadcast axis, aligned from the right across operands; an axis
//     of size 1 that broadcasts never shards ("...ij,...jk->...ik" on [2,4,8] and [1,8,4]).
// Factors claim mesh dimensions in output order, then contracted letters in the order they
// first appear ("bqhd,bkhd->bhqk": b, h, q, k, then d). The equation is the same on every
// shard, so the default expansion runs it locally.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "cc/rules/factor.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

constexpr char kEllipsis = '.';  // one term of a parsed operand stands for "..."

// An operand's terms: letters, and kEllipsis for "...".
StatusOr<std::string> ParseOperand(const OpContext& ctx, const std::string& equation,
                                   const std::string& text) {
  std::string terms;
  for (size_t c = 0; c < text.size(); ++c) {
    const char ch = text[c];
    if (ch == ' ') continue;
    if (ch == '.') {
      if (text.compare(c, 3, "...") != 0 || terms.find(kEllipsis) != std::string::npos) {
        return InvalidArgument("'" + ctx.op_name + "' equation \"" + equation +
                               "\" has a malformed or repeated ellipsis in \"" + text +
                               "\"; use at most one \"...\" per operand.");
      }
      terms.push_back(kEllipsis);
      c += 2;
    } else if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) {
      terms.push_back(ch);
    } else {
      return InvalidArgument("'" + ctx.op_name + "' equation \"" + equation +
                             "\" has an invalid character '" + std::string(1, ch) +
                             "'; use letters, ',', '->' and '...'.");
    }
  }
  return terms;
}

// Splits "ab,bc->ac" into operand terms and output terms. Like TF's Einsum op (tf.einsum
// writes the implicit "->" out before it calls the op), exactly one "->" is required.
StatusOr<std::pair<std::vector<std::string>, std::string>> ParseEquation(
    const OpContext& ctx, const std::string& equation) {
  const size_t arrow = equation.find("->");
  if (arrow == std::string::npos || equation.find("->", arrow + 2) != std::string::npos) {
    return InvalidArgument("'" + ctx.op_name + "' equation \"" + equation +
                           "\" needs exactly one \"->\", as in \"ij,jk->ik\".");
  }
  const std::string lhs = equation.substr(0, arrow);
  std::vector<std::string> operands;
  size_t start = 0;
  while (true) {
    const size_t comma = lhs.find(',', start);
    TFD_ASSIGN_OR_RETURN(std::string terms,
                         ParseOperand(ctx, equation, lhs.substr(start, comma - start)));
    operands.push_back(std::move(terms));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  TFD_ASSIGN_OR_RETURN(std::string output,
                       ParseOperand(ctx, equation, equation.substr(arrow + 2)));
  return std::make_pair(std::move(operands), std::move(output));
}

StatusOr<FactorSpec> EinsumFactors(const OpContext& ctx) {
  const std::optional<std::string> equation = ctx.attrs->GetString("equation");
  if (!equation) {
    return InvalidArgument("'" + ctx.op_name + "' has no `equation` attribute.");
  }
  TFD_ASSIGN_OR_RETURN(auto parsed, ParseEquation(ctx, *equation));
  const auto& [operands, output] = parsed;
  const int num_inputs = static_cast<int>(ctx.inputs.size());
  if (static_cast<int>(operands.size()) != num_inputs) {
    return InvalidArgument("'" + ctx.op_name + "' equation \"" + *equation + "\" names " +
                           std::to_string(operands.size()) + " operands but the op has " +
                           std::to_string(num_inputs) + " inputs.");
  }
  // How many axes each operand's "..." covers; the broadcast axes are the longest of them.
  std::vector<int> ellipsis_rank(num_inputs, 0);
  int broadcast_rank = 0;
  std::map<char, bool> repeated;  // letter -> whether an operand (or the output) repeats it
  for (int i = 0; i < num_inputs; ++i) {
    const std::string& op = operands[i];
    const bool has_ellipsis = op.find(kEllipsis) != std::string::npos;
    const int letters = static_cast<int>(op.size()) - (has_ellipsis ? 1 : 0);
    if (ctx.rank(i) < letters || (!has_ellipsis && ctx.rank(i) != letters)) {
      return InvalidArgument("'" + ctx.op_name + "' equation \"" + *equation + "\" gives " +
                             ctx.Describe(i) + " " + std::to_string(letters) +
                             " axes; its rank is " + std::to_string(ctx.rank(i)) + ".");
    }
    ellipsis_rank[i] = ctx.rank(i) - letters;
    broadcast_rank = std::max(broadcast_rank, ellipsis_rank[i]);
    std::map<char, int> counts;
    for (char t : op) {
      if (t == kEllipsis) continue;
      repeated[t] = repeated[t] || ++counts[t] > 1;
    }
  }
  // A letter repeated in the output writes a diagonal ("i->ii", in einsum's own gradient):
  // like a repeated input letter, its axes are replicated.
  std::map<char, int> output_counts;
  for (char t : output) {
    if (t == kEllipsis) continue;
    if (!repeated.count(t)) {
      return InvalidArgument("'" + ctx.op_name + "' equation \"" + *equation +
                             "\" has output letter '" + std::string(1, t) +
                             "' in no input.");
    }
    repeated[t] = repeated[t] || ++output_counts[t] > 1;
  }
  FactorSpec spec;
  std::map<char, int> factor_of;
  std::vector<int> broadcast;  // the factors of "...", outermost first
  auto kind_of = [&](char letter, bool in_output) {
    if (repeated[letter]) return FactorKind::kNeedReplication;
    return in_output ? FactorKind::kPassThrough : FactorKind::kContracted;
  };
  std::vector<int> out;
  for (char t : output) {
    if (t == kEllipsis) {
      for (int d = 0; d < broadcast_rank; ++d) {
        broadcast.push_back(spec.Add(FactorKind::kPassThrough));
      }
      out.insert(out.end(), broadcast.begin(), broadcast.end());
      continue;
    }
    if (!factor_of.count(t)) factor_of[t] = spec.Add(kind_of(t, true));
    out.push_back(factor_of[t]);
  }
  for (int i = 0; i < num_inputs; ++i) {
    std::vector<int> axes;
    for (char t : operands[i]) {
      if (t == kEllipsis) {
        if (broadcast.size() != static_cast<size_t>(broadcast_rank)) {
          return InvalidArgument("'" + ctx.op_name + "' equation \"" + *equation + "\" has " +
                                 std::to_string(broadcast_rank) +
                                 " broadcast axes but no \"...\" in its output.");
        }
        axes.insert(axes.end(), broadcast.end() - ellipsis_rank[i], broadcast.end());
        continue;
      }
      if (!factor_of.count(t)) factor_of[t] = spec.Add(kind_of(t, false));
      axes.push_back(factor_of[t]);
    }
    spec.inputs.push_back(std::move(axes));
  }
  spec.outputs = {out};
  return spec;
}

const bool kRegistered = RegisterRules({
    {"Einsum", Factors(EinsumFactors), Traits().Linear(Linearity::kOneInput)},
});

}  // namespace
}  // namespace tf_dtensor
