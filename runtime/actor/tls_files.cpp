#include "runtime/actor/tls_files.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <filesystem>
#include <memory>

namespace flowrun::actor {

namespace {

// OpenSSL's reason for the last failure (its error queue emptied), or "" when it gave none.
std::string openssl_reason() {
  std::string why;
  while (const unsigned long e = ERR_get_error()) {
    const char* r = ERR_reason_error_string(e);
    if (r != nullptr) why = r;
  }
  return why.empty() ? std::string() : " (" + why + ")";
}

// An ASN.1 time as OpenSSL prints it ("Jan  2 00:00:00 2020 GMT").
std::string time_text(const ASN1_TIME* t) {
  std::unique_ptr<BIO, decltype(&BIO_free)> b(BIO_new(BIO_s_mem()), BIO_free);
  if (!b || ASN1_TIME_print(b.get(), t) != 1) return "(unreadable date)";
  char* data = nullptr;
  const long n = BIO_get_mem_data(b.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

}  // namespace

tls_files_report tls_files_check(const std::string& cert, const std::string& key, const std::string& ca) {
  tls_files_report r;
  const int given = !cert.empty() + !key.empty() + !ca.empty();
  if (given == 0) return r;
  if (given != 3) {
    r.error = "TLS needs --tls-cert, --tls-key and --tls-ca together (PEM files; see docs/scaling.md)";
    return r;
  }
  for (const auto* f : {&cert, &key, &ca})
    if (!std::filesystem::is_regular_file(*f)) {
      r.error = "TLS file '" + *f + "' does not exist";
      return r;
    }
  ERR_clear_error();
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_method()), SSL_CTX_free);
  if (!ctx) {
    r.error = "OpenSSL could not make a TLS context" + openssl_reason();
    return r;
  }
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), cert.c_str()) != 1) {
    r.error = "--tls-cert '" + cert + "' is not a PEM certificate" + openssl_reason() +
              ": give the certificate file (-----BEGIN CERTIFICATE-----)";
    return r;
  }
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(nullptr, EVP_PKEY_free);
  bool encrypted = false;  // OpenSSL asked for a passphrase: the key is encrypted
  {
    std::unique_ptr<BIO, decltype(&BIO_free)> b(BIO_new_file(key.c_str(), "r"), BIO_free);
    // A callback that gives no passphrase: with none, OpenSSL's default one prompts on the terminal
    // (and caf_openssl's load at the first connection prompted again, the daemon waiting there).
    auto no_passphrase = [](char*, int, int, void* asked) -> int {
      *static_cast<bool*>(asked) = true;
      return 0;
    };
    if (b) pkey.reset(PEM_read_bio_PrivateKey(b.get(), nullptr, no_passphrase, &encrypted));
  }
  if (!pkey && encrypted) {
    ERR_clear_error();
    r.error = "--tls-key '" + key + "' is encrypted (a passphrase protects it), which a daemon cannot type in: "
              "give an unencrypted copy (openssl pkey -in " + key + " -out KEY.pem) kept readable by its owner only";
    return r;
  }
  if (!pkey) {
    r.error = "--tls-key '" + key + "' is not a PEM private key" + openssl_reason() +
              ": give the unencrypted key file (-----BEGIN PRIVATE KEY-----)";
    return r;
  }
  if (SSL_CTX_use_PrivateKey(ctx.get(), pkey.get()) != 1 || SSL_CTX_check_private_key(ctx.get()) != 1) {
    r.error = "--tls-key '" + key + "' is not the private key of --tls-cert '" + cert + "'" + openssl_reason() +
              ": give the key that was made with that certificate";
    return r;
  }
  if (SSL_CTX_load_verify_locations(ctx.get(), ca.c_str(), nullptr) != 1) {
    r.error = "--tls-ca '" + ca + "' holds no PEM CA certificate" + openssl_reason() +
              ": give the CA certificate that issued the cluster's certificates";
    return r;
  }
  X509* x = SSL_CTX_get0_certificate(ctx.get());
  if (x == nullptr) {
    r.error = "--tls-cert '" + cert + "' holds no certificate";
    return r;
  }
  if (X509_cmp_current_time(X509_get0_notAfter(x)) < 0) {
    r.error = "--tls-cert '" + cert + "' expired on " + time_text(X509_get0_notAfter(x)) +
              ": peers refuse it; issue a new certificate";
    return r;
  }
  if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0) {
    r.error = "--tls-cert '" + cert + "' is not valid before " + time_text(X509_get0_notBefore(x)) +
              ": peers refuse it until then (check this machine's clock, or issue one valid now)";
    return r;
  }
  // does this certificate chain to the CA file? (peers trusting only that CA check exactly this)
  X509_STORE* store = SSL_CTX_get_cert_store(ctx.get());
  STACK_OF(X509)* chain = nullptr;
  SSL_CTX_get0_chain_certs(ctx.get(), &chain);
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> vctx(X509_STORE_CTX_new(), X509_STORE_CTX_free);
  if (vctx && X509_STORE_CTX_init(vctx.get(), store, x, chain) == 1) {
    if (X509_verify_cert(vctx.get()) != 1)
      r.warnings.push_back("--tls-cert '" + cert + "' does not chain to --tls-ca '" + ca + "' (" +
                           X509_verify_cert_error_string(X509_STORE_CTX_get_error(vctx.get())) +
                           "): peers that trust only that CA will refuse this process");
  }
  ERR_clear_error();
  return r;
}

}  // namespace flowrun::actor
