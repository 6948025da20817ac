#include "launcher/channel_flags.h"

namespace deltaserve {

std::vector<FlagSpec> ChannelSecurityFlags(const std::string& token_flag) {
  return {
      {"tls-ca", "F", "connect with TLS; the server's certificate must chain to this CA (PEM)"},
      {"tls-cert", "F", "with --tls-key: the client certificate for mutual TLS (PEM)"},
      {"tls-key", "F", "its private key (PEM, mode 600)"},
      {"tls-server-name", "NAME",
       "the name the server's certificate must carry (default: the "
       "host of the address)"},
      {token_flag, "F",
       "send the first token of this file (mode 600; `principal:token` or `token` lines) as "
       "`authorization: Bearer`"},
  };
}

ChannelSecurity ChannelSecurityFrom(const Flags& flags, const std::string& token_flag) {
  ChannelSecurity s;
  s.ca_file = flags.GetString("tls-ca");
  s.cert_file = flags.GetString("tls-cert");
  s.key_file = flags.GetString("tls-key");
  s.server_name = flags.GetString("tls-server-name");
  s.token_file = flags.GetString(token_flag);
  return s;
}

}  // namespace deltaserve
