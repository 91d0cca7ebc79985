// The repository root, for unit tests that read files shipped in it (configs/, the e2e
// cluster files). meson may compile by a relative path, so __FILE__ alone is not enough:
// failing that, the root is the first directory up from here that holds configs/devices.json.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>

namespace ht::test_fixtures {

inline std::filesystem::path source_root() {
  namespace fs = std::filesystem;
  const fs::path file(__FILE__);  // tests/unit/source_root.h
  if (file.is_absolute()) return file.parent_path().parent_path().parent_path();
  for (fs::path dir = fs::current_path();; dir = dir.parent_path()) {
    if (fs::exists(dir / "configs/devices.json")) return dir;
    if (dir == dir.parent_path()) break;
  }
  FAIL("cannot find the source tree from " << fs::current_path() << " and " << __FILE__);
  return {};
}

}  // namespace ht::test_fixtures
