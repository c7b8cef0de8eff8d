// TLS files of a cluster process (docs/scaling.md, "TLS"): checked when the process starts, so a
// daemon with a key that is not its certificate's, or a CA file that is not PEM, is refused with the
// file named (caf_openssl loads them only at the first connection, and a daemon then aborted on it:
// "terminate called after throwing ... cannot load private key").
#pragma once

#include <string>
#include <vector>

namespace flowrun::actor {

/// What tls_files_check found: `error` (empty when the files serve) names the file and the fix;
/// `warnings` are what peers may refuse although this process can start (its certificate not issued
/// by the CA it trusts, so peers that trust only that CA refuse it).
struct tls_files_report {
  std::string error;
  std::vector<std::string> warnings;
};

/// Loads the three PEM files as caf_openssl will (certificate chain, private key, trusted CA file)
/// into an OpenSSL context and checks that the key is the certificate's, that the certificate is
/// valid now (not expired, not yet valid: the date is named), and that it chains to the CA file
/// (a warning when not). All three empty: TLS off, nothing checked. Some but not all given: an error.
/// Never throws.
tls_files_report tls_files_check(const std::string& cert, const std::string& key, const std::string& ca);

}  // namespace flowrun::actor
