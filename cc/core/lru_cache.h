// A bounded map that drops its least recently used entry when full: caches that must not
// grow with a long-running program's history (the expanded tf.functions, one per function
// and input signature) keep their working set and forget the rest.
//
//   LruCache<std::string, int> cache(2);
//   cache.Insert("a", 1); cache.Insert("b", 2);
//   cache.Find("a");       // 1, and "a" is now the most recently used
//   cache.Insert("c", 3);  // drops "b"
//
// Not thread-safe: its owner locks around it.
#ifndef TF_DTENSOR_CC_CORE_LRU_CACHE_H_
#define TF_DTENSOR_CC_CORE_LRU_CACHE_H_

#include <cstddef>
#include <functional>
#include <list>
#include <optional>
#include <unordered_map>
#include <utility>

namespace tf_dtensor {

template <typename Key, typename Value, typename Hash = std::hash<Key>>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The value cached for `key`, now the most recently used; null when there is none. The
  // pointer is valid until the next Insert.
  const Value* Find(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    entries_.splice(entries_.begin(), entries_, it->second);
    return &it->second->second;
  }

  // Caches `value` for `key` as the most recently used entry (replacing the value cached
  // for it before), dropping the least recently used entry when the cache is full. Returns
  // the value dropped, if any, for its owner to release what it holds elsewhere.
  std::optional<Value> Insert(const Key& key, Value value) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      it->second->second = std::move(value);
      entries_.splice(entries_.begin(), entries_, it->second);
      return std::nullopt;
    }
    std::optional<Value> dropped;
    if (entries_.size() == capacity_) {
      dropped = std::move(entries_.back().second);
      index_.erase(entries_.back().first);
      entries_.pop_back();
    }
    entries_.emplace_front(key, std::move(value));
    index_.emplace(key, entries_.begin());
    return dropped;
  }

  // Drops every entry that `drop(key, value)` picks; returns how many went.
  template <class Pred>
  size_t EraseIf(Pred drop) {
    size_t erased = 0;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (drop(it->first, it->second)) {
        index_.erase(it->first);
        it = entries_.erase(it);
        ++erased;
      } else {
        ++it;
      }
    }
    return erased;
  }

  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  using Entry = std::pair<Key, Value>;
  size_t capacity_;
  std::list<Entry> entries_;  // the most recently used first
  std::unordered_map<Key, typename std::list<Entry>::iterator, Hash> index_;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_CORE_LRU_CACHE_H_
