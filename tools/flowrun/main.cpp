// flowrun: the command-line entry point.
#include <cstdio>
#include <exception>

#include <spdlog/spdlog.h>

#include "runtime/util/assets.h"
#include "tools/flowrun/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"flowrun: a dataflow runtime that trains and aligns language models"};
  app.require_subcommand(1);
  flowrun::cli::add_generate(app);
  flowrun::cli::add_train_lm(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const flowrun::asset_missing& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
