#!/bin/sh
# Transparent interception for the pod's network namespace (the way service meshes do it):
# every outbound TCP connection to an intercepted port, from any user but the governor's,
# is redirected to the governor's transparent listener; any other outbound TCP or UDP from
# those users is refused, but DNS to the pod's resolvers; ICMP and every other protocol sent
# from a socket (ping sockets, SCTP) are dropped. The governor's own user is exempt, so its
# upstream connections leave the pod. Loopback is untouched (the explicit proxy, the
# control plane). Run once, as root with CAP_NET_ADMIN (+ CAP_NET_RAW), before the agent
# starts: the chart's init container, and tests/test_intercept.py, run this same file.
#
# Settings (environment):
#   GOVERNOR_UID       the governor's user id (required): exempt from every rule
#   TRANSPARENT_PORT   the governor's transparent listener on 127.0.0.1 (default 15001)
#   INTERCEPT_PORTS    comma-separated destination ports redirected (default 80,443)
#   ALLOW_DNS          1: UDP/TCP port 53 may leave to DNS_SERVERS only (default 1)
#   DNS_SERVERS        comma-separated resolver addresses (default: the nameservers of
#                      /etc/resolv.conf, the cluster's resolver in a pod); port 53 anywhere
#                      else is refused: an LLM listening on port 53 is not reachable
#   IPTABLES, IP6TABLES  the commands (default iptables, ip6tables; IP6TABLES='' skips IPv6)
set -eu
uid=${GOVERNOR_UID:?GOVERNOR_UID: the governor user id to exempt}
port=${TRANSPARENT_PORT:-15001}
ports=${INTERCEPT_PORTS:-80,443}
allow_dns=${ALLOW_DNS:-1}
resolv=${RESOLV_CONF:-/etc/resolv.conf}
if [ -z "${DNS_SERVERS:-}" ] && [ "$allow_dns" = 1 ] && [ -r "$resolv" ]; then
  DNS_SERVERS=$(awk '$1 == "nameserver" { printf "%s%s", sep, $2; sep = "," }' "$resolv")
fi
dns_servers=${DNS_SERVERS:-}
ipt=${IPTABLES:-iptables}
ip6t=${IP6TABLES-ip6tables}
chain=GOVERNOR_OUTPUT

case "$uid$port" in *[!0-9]*) echo "intercept: GOVERNOR_UID and TRANSPARENT_PORT must be numbers" >&2; exit 2;; esac
case "$ports" in *[!0-9,]*|''|,*|*,|*,,*) echo "intercept: INTERCEPT_PORTS must be comma-separated port numbers" >&2; exit 2;; esac
case "$dns_servers" in *[!0-9a-fA-F.:,]*|,*|*,|*,,*) echo "intercept: DNS_SERVERS must be comma-separated IP addresses" >&2; exit 2;; esac
if [ "$allow_dns" = 1 ] && [ -z "$dns_servers" ]; then
  echo "intercept: ALLOW_DNS=1 but no resolver (DNS_SERVERS unset, none in $resolv): DNS stays refused" >&2
fi

# A chain of our own, emptied first: running this again (a restarted init container) is harmless.
fresh_chain() {  # $1 command, $2 table
  "$1" -w -t "$2" -N "$chain" 2>/dev/null || "$1" -w -t "$2" -F "$chain"
  "$1" -w -t "$2" -C OUTPUT -j "$chain" 2>/dev/null || "$1" -w -t "$2" -A OUTPUT -j "$chain"
}

# Refuse what the agent may not send directly (filter table; it runs after nat's redirect,
# so a redirected connection is seen here going to 127.0.0.1 and passes; its output
# interface is still the original one, hence the address match beside -o lo).
refuse_the_rest() {  # $1 command, $2 the loopback network
  fresh_chain "$1" filter
  # answers on connections made to the pod (probes, a port the agent serves), and the rest
  # of connections whose first packet passed these rules
  "$1" -w -t filter -A "$chain" -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN
  "$1" -w -t filter -A "$chain" -m owner --uid-owner "$uid" -j RETURN
  "$1" -w -t filter -A "$chain" -o lo -j RETURN
  "$1" -w -t filter -A "$chain" -d "$2" -j RETURN
  # DNS to the pod's resolvers only (an address of the other family is skipped for this one)
  if [ "$allow_dns" = 1 ]; then
    for server in $(echo "$dns_servers" | tr ',' ' '); do
      case "$1:$server" in "$ip6t":*:*|"$ipt":*.*) ;; *) continue;; esac
      "$1" -w -t filter -A "$chain" -d "$server" -p udp --dport 53 -j RETURN
      "$1" -w -t filter -A "$chain" -d "$server" -p tcp --dport 53 -j RETURN
    done
  fi
  "$1" -w -t filter -A "$chain" -p tcp -j REJECT --reject-with tcp-reset
  "$1" -w -t filter -A "$chain" -p udp -j REJECT
  # Anything else a process sends (ICMP through ping sockets, with any payload; SCTP; raw
  # sockets) is dropped. Only packets with a local socket: the kernel's own (neighbour
  # discovery, the ICMP errors REJECT sends) have none and must pass.
  "$1" -w -t filter -A "$chain" -m owner --socket-exists -j DROP
}

fresh_chain "$ipt" nat
"$ipt" -w -t nat -A "$chain" -m owner --uid-owner "$uid" -j RETURN
"$ipt" -w -t nat -A "$chain" -o lo -j RETURN
"$ipt" -w -t nat -A "$chain" -p tcp -m multiport --dports "$ports" -j REDIRECT --to-ports "$port"
refuse_the_rest "$ipt" 127.0.0.0/8

# The listener is IPv4 (127.0.0.1): the agent's IPv6 is refused outright, never left open.
if [ -n "$ip6t" ] && command -v "$ip6t" >/dev/null 2>&1; then
  refuse_the_rest "$ip6t" ::1/128
fi
echo "intercept: outbound TCP to ports $ports -> 127.0.0.1:$port; DNS to ${dns_servers:-none}; other outbound refused; uid $uid exempt"
