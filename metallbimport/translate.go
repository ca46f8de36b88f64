package metallbimport

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/poolspec"
)

// Defaults of Options.
const (
	DefaultNamespace         = "metallb-system"
	DefaultPasswordNamespace = "vipcast-bgp-passwords" //nolint:gosec // G101: a namespace's name, not a credential
)

// PeerLabel is the label every translated BGPPeer carries, valued with the
// MetalLB BGPPeer's name: a pool whose BGPAdvertisements name their peers
// selects them by it (spec.bgp.peerSelector).
const PeerLabel = "vipcast.io/metallb-peer"

// ImportedFrom is the annotation on every translated object naming the
// MetalLB object it came from ("metallb.io/v1beta1 IPAddressPool
// metallb-system/public"), for the runbook's way back.
const ImportedFrom = "vipcast.io/imported-from"

// BGP defaults MetalLB applies to a BFDProfile's unset fields.
const (
	bfdDefaultIntervalMs = 300
	bfdDefaultMultiplier = 3
)

// Options configure Translate.
type Options struct {
	// Namespace is MetalLB's namespace, the only one whose objects MetalLB
	// reads (DefaultNamespace when empty); objects elsewhere are noted and
	// left out.
	Namespace string
	// PasswordNamespace is where the Secrets for BGPPeers' plain-text
	// passwords are made (DefaultPasswordNamespace when empty).
	PasswordNamespace string
}

// Result is a translation's output.
type Result struct {
	Pools   []*v1alpha1.IPPool
	Peers   []*v1alpha1.BGPPeer
	Secrets []*corev1.Secret
	// PasswordSecrets are the Secrets ("namespace/name") the translated
	// peers read passwords from: the chart's speaker.bgpPasswordSecrets.secrets
	// must list them, since the speakers read no other Secret.
	PasswordSecrets []string
	// Notes name every field the translation does not carry over, and why.
	Notes []Note
}

// Note is a field of a MetalLB object the translation leaves behind, and
// why; or an object it leaves out.
type Note struct {
	// Object is the MetalLB object ("IPAddressPool metallb-system/public").
	Object string
	// Field is the field's path ("spec.connectTime"); "" for the object as a
	// whole.
	Field string
	// Why says what becomes of it and why.
	Why string
}

func (n Note) String() string {
	if n.Field == "" {
		return n.Object + ": " + n.Why
	}
	return n.Object + ": " + n.Field + ": " + n.Why
}

// RefusedError lists the parts of a MetalLB configuration that the
// translation would get wrong; Translate returns it and nothing else, so
// that no half-translated configuration is applied.
type RefusedError struct {
	Refusals []Note
}

func (e *RefusedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "refusing to translate: %d part(s) of MetalLB's configuration would not mean the same under vipcast:", len(e.Refusals))
	for _, r := range e.Refusals {
		b.WriteString("\n  " + r.String())
	}
	return b.String()
}

// translation is one Translate call's state.
type translation struct {
	opts     Options
	objs     *Objects
	res      *Result
	refusals []Note
	// aliases are the Community objects' names → values.
	aliases map[string]string
	bfd     map[string]*BFDProfile
}

func (t *translation) note(object, field, why string, args ...any) {
	t.res.Notes = append(t.res.Notes, Note{Object: object, Field: field, Why: fmt.Sprintf(why, args...)})
}

func (t *translation) refuse(object, field, why string, args ...any) {
	t.refusals = append(t.refusals, Note{Object: object, Field: field, Why: fmt.Sprintf(why, args...)})
}

// Translate turns MetalLB's configuration into vipcast's: each
// IPAddressPool that a BGPAdvertisement announces into an IPPool of the
// same name (its spec.bgp from the advertisements), each BGPPeer into a
// BGPPeer of the same name (its BFD from its BFDProfile, a plain-text
// password into a Secret). Every field it does not carry over is a Note;
// a configuration it would translate wrongly is a *RefusedError naming
// each such part, and no Result.
func Translate(objs *Objects, opts Options) (*Result, error) {
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.PasswordNamespace == "" {
		opts.PasswordNamespace = DefaultPasswordNamespace
	}
	t := &translation{opts: opts, objs: inNamespace(objs, opts.Namespace), res: &Result{}, aliases: map[string]string{}, bfd: map[string]*BFDProfile{}}
	t.duplicates()
	for _, c := range t.objs.Communities {
		for i, a := range c.Spec.Communities {
			if a.Name == "" {
				t.refuse(ref(&c.TypeMeta, &c.ObjectMeta), fmt.Sprintf("spec.communities[%d].name", i), "empty")
				continue
			}
			t.aliases[a.Name] = a.Value
		}
	}
	for i := range t.objs.BFDProfiles {
		t.bfd[t.objs.BFDProfiles[i].Name] = &t.objs.BFDProfiles[i]
	}
	for i := range t.objs.L2Ads {
		ad := &t.objs.L2Ads[i]
		t.note(ref(&ad.TypeMeta, &ad.ObjectMeta), "", "not carried over: vipcast announces over BGP only, never by ARP or NDP on a node's interface")
	}
	for i := range t.objs.Peers {
		t.peer(&t.objs.Peers[i])
	}
	for i := range t.objs.Pools {
		t.pool(&t.objs.Pools[i])
	}
	t.admit()
	if len(t.refusals) > 0 {
		return nil, &RefusedError{Refusals: t.refusals}
	}
	slices.SortFunc(t.res.Pools, func(a, b *v1alpha1.IPPool) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(t.res.Peers, func(a, b *v1alpha1.BGPPeer) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(t.res.Secrets, func(a, b *corev1.Secret) int { return cmp.Compare(a.Name, b.Name) })
	slices.Sort(t.res.PasswordSecrets)
	t.res.PasswordSecrets = slices.Compact(t.res.PasswordSecrets)
	return t.res, nil
}

// inNamespace keeps the objects of MetalLB's namespace and notes the others, which
// MetalLB itself ignores.
func inNamespace(o *Objects, ns string) *Objects {
	out := &Objects{Skipped: o.Skipped}
	keep := func(obj object) bool {
		tm, om := obj.meta()
		if om.Namespace == ns || om.Namespace == "" {
			return true
		}
		out.Skipped = append(out.Skipped, fmt.Sprintf("%s: in namespace %s, which MetalLB (in %s) does not read", ref(tm, om), om.Namespace, ns))
		return false
	}
	out.Pools = keepIf(o.Pools, keep)
	out.Peers = keepIf(o.Peers, keep)
	out.BGPAds = keepIf(o.BGPAds, keep)
	out.L2Ads = keepIf(o.L2Ads, keep)
	out.Communities = keepIf(o.Communities, keep)
	out.BFDProfiles = keepIf(o.BFDProfiles, keep)
	return out
}

// keepIf returns the objects of list that keep reports true for.
func keepIf[T any, P interface {
	*T
	object
}](list []T, keep func(object) bool) []T {
	var out []T
	for i := range list {
		if keep(P(&list[i])) {
			out = append(out, list[i])
		}
	}
	return out
}

// duplicates refuses two objects of one kind and name (files can hold
// them; a cluster cannot): which one MetalLB would hold is unknown.
func (t *translation) duplicates() {
	seen := map[string]bool{}
	for _, obj := range t.objs.all() {
		r := ref(obj.meta())
		if seen[r] {
			t.refuse(r, "", "given more than once; a cluster holds one object of a name: keep one")
		}
		seen[r] = true
	}
}

// ref names an object as notes do.
func ref(tm *metav1.TypeMeta, om *metav1.ObjectMeta) string {
	if om.Namespace == "" {
		return tm.Kind + " " + om.Name
	}
	return tm.Kind + " " + om.Namespace + "/" + om.Name
}

func imported(tm *metav1.TypeMeta, om *metav1.ObjectMeta) map[string]string {
	return map[string]string{ImportedFrom: tm.APIVersion + " " + ref(tm, om)}
}

// peer translates one MetalLB BGPPeer.
func (t *translation) peer(p *BGPPeer) {
	name := ref(&p.TypeMeta, &p.ObjectMeta)
	s := &p.Spec
	refusedBefore := len(t.refusals)
	out := &v1alpha1.BGPPeer{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "BGPPeer"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        p.Name,
			Labels:      map[string]string{PeerLabel: p.Name},
			Annotations: imported(&p.TypeMeta, &p.ObjectMeta),
		},
		Spec: v1alpha1.BGPPeerSpec{PeerASN: s.ASN, LocalASN: s.MyASN, SourceAddress: s.SrcAddress},
	}
	addr := t.peerAddress(name, s, out)
	if s.Port != 0 {
		out.Spec.Port = ptr.To(int32(s.Port))
	}
	t.timers(name, s.HoldTime, s.KeepaliveTime, out)
	if s.ConnectTime != nil {
		t.note(name, "spec.connectTime", "not carried over: vipcast retries a connection every 5 s")
	}
	if s.RouterID != "" {
		t.note(name, "spec.routerID", "not carried over: each node's speaker uses the node's address as its router ID")
	}
	switch len(s.NodeSelectors) {
	case 0:
	case 1:
		out.Spec.NodeSelector = s.NodeSelectors[0].DeepCopy()
	default:
		t.refuse(name, "spec.nodeSelectors", "%d selectors, of which a node matches any: vipcast's spec.nodeSelector is one selector; make them one", len(s.NodeSelectors))
	}
	t.password(p, name, out)
	if s.BFDProfile != "" {
		t.bfdFor(name, s.BFDProfile, s.EBGPMultiHop, out)
	}
	if s.EnableGracefulRestart {
		out.Spec.GracefulRestart = &v1alpha1.GracefulRestart{Enabled: true}
	}
	if s.EBGPMultiHop {
		if s.ASN != 0 && s.ASN == s.MyASN {
			t.refuse(name, "spec.ebgpMultiHop", "set for an iBGP peer (MetalLB refuses it too)")
		}
		out.Spec.EBGPMultiHop = ptr.To(int32(255))
	}
	// MetalLB 0.15 negotiates the session's own family unless
	// dualStackAddressFamily; vipcast both unless families says.
	switch {
	case !addr.IsValid():
	case s.DualStackAddressFamily:
		out.Spec.Families = []v1alpha1.AddressFamily{v1alpha1.AddressFamilyIPv4Unicast, v1alpha1.AddressFamilyIPv6Unicast}
	case addr.Is4():
		out.Spec.Families = []v1alpha1.AddressFamily{v1alpha1.AddressFamilyIPv4Unicast}
	default:
		out.Spec.Families = []v1alpha1.AddressFamily{v1alpha1.AddressFamilyIPv6Unicast}
	}
	if len(t.refusals) > refusedBefore {
		return
	}
	if prob := out.Spec.Check(); prob != nil {
		t.refuse(name, "", "vipcast-ccm would refuse the translated BGPPeer (%s): %s", prob.Reason, prob.Message)
		return
	}
	t.res.Peers = append(t.res.Peers, out)
}

// peerAddress carries a BGPPeer's ASNs and address, refusing what vipcast
// has no equivalent for (a dynamic ASN, an unnumbered session, a VRF), and
// returns the address (invalid when refused).
func (t *translation) peerAddress(name string, s *BGPPeerSpec, out *v1alpha1.BGPPeer) netip.Addr {
	if s.MyASN == 0 {
		t.refuse(name, "spec.myASN", "missing (MetalLB refuses it too)")
	}
	switch {
	case s.DynamicASN != "":
		t.refuse(name, "spec.dynamicASN", "vipcast needs the router's ASN: set spec.peerASN to it instead of dynamicASN %q", s.DynamicASN)
	case s.ASN == 0:
		t.refuse(name, "spec.peerASN", "missing (MetalLB refuses it too)")
	}
	if s.Interface != "" {
		t.refuse(name, "spec.interface", "vipcast peers with an address, not unnumbered over an interface: set spec.peerAddress")
	}
	addr, err := netip.ParseAddr(s.Address)
	switch {
	case s.Address == "" && s.Interface == "":
		t.refuse(name, "spec.peerAddress", "missing (MetalLB refuses it too)")
	case s.Address != "" && err != nil:
		t.refuse(name, "spec.peerAddress", "%q is not an IP address", s.Address)
	default:
		out.Spec.PeerAddress = addr.String()
	}
	if s.VRFName != "" {
		t.refuse(name, "spec.vrf", "vipcast's sessions are in the node's main routing table; it has no VRF")
	}
	return addr
}

// password carries a BGPPeer's password: a Secret it names as a
// passwordSecretRef, a plain-text one moved into a new Secret.
func (t *translation) password(p *BGPPeer, name string, out *v1alpha1.BGPPeer) {
	s := &p.Spec
	switch {
	case s.Password != "" && s.PasswordSecret.Name != "":
		t.refuse(name, "spec.password", "both password and passwordSecret are set (MetalLB refuses it too)")
	case s.Password != "":
		secret := &corev1.Secret{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{Name: p.Name + "-bgp-password", Namespace: t.opts.PasswordNamespace, Annotations: imported(&p.TypeMeta, &p.ObjectMeta)},
			StringData: map[string]string{"password": s.Password},
		}
		t.res.Secrets = append(t.res.Secrets, secret)
		out.Spec.PasswordSecretRef = &v1alpha1.SecretKeyReference{Namespace: secret.Namespace, Name: secret.Name, Key: "password"}
		t.res.PasswordSecrets = append(t.res.PasswordSecrets, secret.Namespace+"/"+secret.Name)
		t.note(name, "spec.password", "moved into Secret %s/%s: vipcast reads passwords from Secrets only", secret.Namespace, secret.Name)
	case s.PasswordSecret.Name != "":
		ns := cmp.Or(s.PasswordSecret.Namespace, p.Namespace, t.opts.Namespace)
		out.Spec.PasswordSecretRef = &v1alpha1.SecretKeyReference{Namespace: ns, Name: s.PasswordSecret.Name, Key: "password"}
		t.res.PasswordSecrets = append(t.res.PasswordSecrets, ns+"/"+s.PasswordSecret.Name)
	}
}

// timers carries a BGPPeer's hold and keepalive times, which vipcast
// takes in whole seconds, a hold time of 3s to 65535s (never 0: a dead
// node must not keep its routes) and a keepalive of 1s or more below it.
func (t *translation) timers(name string, hold, keepalive *metav1.Duration, out *v1alpha1.BGPPeer) {
	inRange := func(field string, d, lowest time.Duration) bool {
		switch {
		case d%time.Second != 0:
			t.refuse(name, field, "%s: vipcast takes whole seconds", d)
		case d < lowest || d > 65535*time.Second:
			t.refuse(name, field, "%s: vipcast takes %s to 65535s", d, lowest)
		default:
			return true
		}
		return false
	}
	switch {
	case hold == nil:
	case hold.Duration == 0:
		t.refuse(name, "spec.holdTime", "0s (no keepalives, a session that never times out): vipcast refuses it, since a dead node must not keep its routes; set a hold time such as 90s")
	case inRange("spec.holdTime", hold.Duration, 3*time.Second):
		out.Spec.HoldTime = hold
	}
	switch {
	case keepalive == nil:
	case keepalive.Duration == 0:
		t.note(name, "spec.keepaliveTime", "0s not carried over: vipcast sends keepalives, a third of the hold time apart")
	case hold != nil && hold.Duration != 0 && keepalive.Duration >= hold.Duration:
		t.refuse(name, "spec.keepaliveTime", "%s is not shorter than holdTime %s (MetalLB refuses it too)", keepalive.Duration, hold.Duration)
	case inRange("spec.keepaliveTime", keepalive.Duration, time.Second):
		out.Spec.KeepaliveTime = keepalive
	}
}

// bfdFor sets out's BFD from the BFDProfile named profile.
func (t *translation) bfdFor(name, profile string, multihop bool, out *v1alpha1.BGPPeer) {
	b, ok := t.bfd[profile]
	if !ok {
		t.refuse(name, "spec.bfdProfile", "no BFDProfile %q in %s", profile, t.opts.Namespace)
		return
	}
	ms := func(v *uint32) *metav1.Duration {
		return &metav1.Duration{Duration: time.Duration(ptr.Deref(v, bfdDefaultIntervalMs)) * time.Millisecond}
	}
	bp := ref(&b.TypeMeta, &b.ObjectMeta)
	cfg := &v1alpha1.BFDConfig{
		MinTx:      ms(b.Spec.TransmitInterval),
		MinRx:      ms(b.Spec.ReceiveInterval),
		Multiplier: ptr.To(int32(ptr.Deref(b.Spec.DetectMultiplier, bfdDefaultMultiplier))), //nolint:gosec // MetalLB bounds it to 2–255
	}
	if multihop {
		cfg.Multihop = true
		if b.Spec.MinimumTTL != nil {
			cfg.MinimumTTL = ptr.To(int32(*b.Spec.MinimumTTL)) //nolint:gosec // MetalLB bounds it to 1–254
		}
	} else if b.Spec.MinimumTTL != nil {
		t.note(bp, "spec.minimumTtl", "not carried over for %s: a single-hop session accepts TTL 255 only (RFC 5881)", name)
	}
	if ptr.Deref(b.Spec.EchoMode, false) {
		t.note(bp, "spec.echoMode", "not carried over for %s: vipcast's BFD sends no echo packets; its control packets' timers detect a failure", name)
	}
	if b.Spec.EchoInterval != nil {
		t.note(bp, "spec.echoInterval", "not carried over for %s: no echo packets", name)
	}
	if ptr.Deref(b.Spec.PassiveMode, false) {
		t.note(bp, "spec.passiveMode", "not carried over for %s: vipcast's BFD session starts actively", name)
	}
	out.Spec.BFD = cfg
}

// advertising is what the BGPAdvertisements selecting one pool ask for.
type advertising struct {
	ads       []string // their names
	agg, agg6 int32
	localPref uint32
	comms     []string // resolved, sorted
	nodes     []metav1.LabelSelector
	peers     []string // nil: every peer
}

// pool translates one IPAddressPool.
func (t *translation) pool(p *IPAddressPool) {
	name := ref(&p.TypeMeta, &p.ObjectMeta)
	var bgp []*BGPAdvertisement
	for i := range t.objs.BGPAds {
		if t.selects(&t.objs.BGPAds[i].TypeMeta, &t.objs.BGPAds[i].ObjectMeta, t.objs.BGPAds[i].Spec.IPAddressPools, t.objs.BGPAds[i].Spec.IPAddressPoolSelectors, p) {
			bgp = append(bgp, &t.objs.BGPAds[i])
		}
	}
	var l2 []string
	for i := range t.objs.L2Ads {
		ad := &t.objs.L2Ads[i]
		if t.selects(&ad.TypeMeta, &ad.ObjectMeta, ad.Spec.IPAddressPools, ad.Spec.IPAddressPoolSelectors, p) {
			l2 = append(l2, ad.Name)
		}
	}
	if len(bgp) == 0 {
		why := "MetalLB announces it nowhere"
		if len(l2) > 0 {
			why = "MetalLB announces it by L2 only (L2Advertisement " + strings.Join(l2, ", ") + ")"
		}
		t.note(name, "", "not translated: no BGPAdvertisement selects it, %s, and vipcast announces every pool over BGP; its Services keep their addresses only if another pool holds them", why)
		return
	}
	adv, ok := t.advertising(name, bgp)
	if !ok {
		return
	}
	out := &v1alpha1.IPPool{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "IPPool"},
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Annotations: imported(&p.TypeMeta, &p.ObjectMeta)},
		Spec: v1alpha1.IPPoolSpec{
			AutoAssign:    p.Spec.AutoAssign,
			AvoidBuggyIPs: p.Spec.AvoidBuggyIPs,
		},
	}
	t.poolAddresses(name, p, out)
	out.Spec.BGP = t.poolBGP(name, adv)
	t.res.Pools = append(t.res.Pools, out)
}

// poolAddresses carries an IPAddressPool's addresses (as vipcast writes
// them) and its serviceAllocation.
func (t *translation) poolAddresses(name string, p *IPAddressPool, out *v1alpha1.IPPool) {
	for i, a := range p.Spec.Addresses {
		norm, changed, err := normalizeAddresses(a)
		if err != nil {
			t.refuse(name, fmt.Sprintf("spec.addresses[%d]", i), "%v", err)
			continue
		}
		if changed {
			t.note(name, fmt.Sprintf("spec.addresses[%d]", i), "%q written as %q, as vipcast takes it", a, norm)
		}
		out.Spec.Addresses = append(out.Spec.Addresses, norm)
	}
	if sa := p.Spec.ServiceAllocation; sa != nil {
		alloc := &v1alpha1.IPPoolAllocation{Namespaces: sa.Namespaces, NamespaceSelectors: sa.NamespaceSelectors, ServiceSelectors: sa.ServiceSelectors}
		switch {
		case sa.Priority > 0:
			alloc.Priority = ptr.To(int32(sa.Priority)) //nolint:gosec // MetalLB's CRD bounds it
		case sa.Priority < 0:
			t.refuse(name, "spec.serviceAllocation.priority", "%d: negative", sa.Priority)
		}
		// MetalLB's 0 is "no priority", tried after the others, as
		// vipcast's unset priority.
		if alloc.Priority != nil || len(alloc.Namespaces)+len(alloc.NamespaceSelectors)+len(alloc.ServiceSelectors) > 0 {
			out.Spec.Allocation = alloc
		}
	}
}

// poolBGP is the spec.bgp that announces a pool the way its
// BGPAdvertisements do; nil when they ask for nothing but the defaults.
func (t *translation) poolBGP(name string, adv advertising) *v1alpha1.IPPoolBGP {
	b := &v1alpha1.IPPoolBGP{}
	for _, c := range adv.comms {
		if v, ok := strings.CutPrefix(c, "large:"); ok {
			b.LargeCommunities = append(b.LargeCommunities, v)
		} else {
			b.Communities = append(b.Communities, c)
		}
	}
	if adv.localPref != 0 {
		b.LocalPref = ptr.To(adv.localPref)
	}
	if adv.agg != 32 {
		b.AggregationLength = ptr.To(adv.agg)
	}
	if adv.agg6 != 128 {
		b.AggregationLengthV6 = ptr.To(adv.agg6)
	}
	if len(adv.nodes) == 1 {
		b.NodeSelector = adv.nodes[0].DeepCopy()
	}
	if adv.peers != nil {
		b.PeerSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: PeerLabel, Operator: metav1.LabelSelectorOpIn, Values: adv.peers}}}
		for _, pn := range adv.peers {
			if !slices.ContainsFunc(t.objs.Peers, func(p BGPPeer) bool { return p.Name == pn }) {
				t.note(name, "", "BGPAdvertisement %s names BGPPeer %q, which does not exist: no translated peer carries its label", strings.Join(adv.ads, ", "), pn)
			}
		}
	}
	if len(b.Communities)+len(b.LargeCommunities) > 0 || b.LocalPref != nil || b.AggregationLength != nil || b.AggregationLengthV6 != nil || b.NodeSelector != nil || b.PeerSelector != nil {
		return b
	}
	return nil
}

// selects reports whether an advertisement with these pool names and
// selectors selects p; an invalid selector is refused.
func (t *translation) selects(tm *metav1.TypeMeta, om *metav1.ObjectMeta, names []string, sels []metav1.LabelSelector, p *IPAddressPool) bool {
	if len(names) == 0 && len(sels) == 0 {
		return true
	}
	if slices.Contains(names, p.Name) {
		return true
	}
	for i := range sels {
		s, err := metav1.LabelSelectorAsSelector(&sels[i])
		if err != nil {
			t.refuse(ref(tm, om), fmt.Sprintf("spec.ipAddressPoolSelectors[%d]", i), "%v", err)
			continue
		}
		if s.Matches(labels.Set(p.Labels)) {
			return true
		}
	}
	return false
}

// advertising merges the BGPAdvertisements of one pool: vipcast announces
// a pool one way (spec.bgp), so they must agree on everything but peers.
func (t *translation) advertising(pool string, ads []*BGPAdvertisement) (advertising, bool) {
	var out advertising
	ok := true
	allPeers := false
	for i, ad := range ads {
		name := ref(&ad.TypeMeta, &ad.ObjectMeta)
		a := advertising{ads: []string{ad.Name}, agg: ptr.Deref(ad.Spec.AggregationLength, 32), agg6: ptr.Deref(ad.Spec.AggregationLengthV6, 128), localPref: ad.Spec.LocalPref, nodes: ad.Spec.NodeSelectors}
		for j, c := range ad.Spec.Communities {
			v, err := t.community(c)
			if err != nil {
				t.refuse(name, fmt.Sprintf("spec.communities[%d]", j), "%v", err)
				ok = false
				continue
			}
			a.comms = append(a.comms, v)
		}
		slices.Sort(a.comms)
		a.comms = slices.Compact(a.comms)
		if len(a.nodes) > 1 {
			t.refuse(name, "spec.nodeSelectors", "%d selectors, of which a node matches any: vipcast's spec.bgp.nodeSelector is one selector; make them one", len(a.nodes))
			ok = false
		}
		if i == 0 {
			out = a
		} else if diff := a.differs(out); diff != "" {
			t.refuse(pool, "", "BGPAdvertisements %s and %s both announce it, with different %s: vipcast announces a pool one way; make them agree, or split the pool", out.ads[0], ad.Name, diff)
			ok = false
		}
		if len(ad.Spec.Peers) == 0 {
			allPeers = true
		}
		out.peers = append(out.peers, ad.Spec.Peers...)
		if i > 0 {
			out.ads = append(out.ads, ad.Name)
		}
	}
	if allPeers {
		out.peers = nil
	} else {
		slices.Sort(out.peers)
		out.peers = slices.Compact(out.peers)
	}
	return out, ok
}

// differs names what a and b disagree on, but peers; "" when nothing.
func (a advertising) differs(b advertising) string {
	var d []string
	if a.agg != b.agg {
		d = append(d, "aggregationLength")
	}
	if a.agg6 != b.agg6 {
		d = append(d, "aggregationLengthV6")
	}
	if a.localPref != b.localPref {
		d = append(d, "localPref")
	}
	if !slices.Equal(a.comms, b.comms) {
		d = append(d, "communities")
	}
	ja, _ := json.Marshal(a.nodes)
	jb, _ := json.Marshal(b.nodes)
	if string(ja) != string(jb) {
		d = append(d, "nodeSelectors")
	}
	return strings.Join(d, ", ")
}

// community resolves a BGPAdvertisement's community (a Community alias,
// ASN:VALUE or large:GLOBAL:LOCAL1:LOCAL2) to ASN:VALUE or
// large:GLOBAL:LOCAL1:LOCAL2.
func (t *translation) community(c string) (string, error) {
	v := c
	if a, ok := t.aliases[c]; ok {
		v = a
	}
	parts := strings.Split(v, ":")
	switch {
	case len(parts) == 2 && fits(parts, 16):
		return v, nil
	case len(parts) == 4 && strings.EqualFold(parts[0], "large") && fits(parts[1:], 32):
		return "large:" + strings.Join(parts[1:], ":"), nil
	}
	if v != c {
		return "", fmt.Errorf("%q (Community alias of %q) is neither ASN:VALUE nor large:GLOBAL:LOCAL1:LOCAL2", v, c)
	}
	return "", fmt.Errorf("%q is neither ASN:VALUE, large:GLOBAL:LOCAL1:LOCAL2 nor the name of a Community in the namespace", c)
}

func fits(parts []string, bits int) bool {
	for _, p := range parts {
		if _, err := strconv.ParseUint(p, 10, bits); err != nil {
			return false
		}
	}
	return true
}

// normalizeAddresses writes one of MetalLB's spec.addresses entries as
// vipcast takes it: a CIDR with its host bits cleared (MetalLB accepts
// 192.0.2.1/24 as 192.0.2.0/24), a range FIRST-LAST without spaces.
func normalizeAddresses(a string) (string, bool, error) {
	if first, last, ok := strings.Cut(a, "-"); ok {
		f, err1 := netip.ParseAddr(strings.TrimSpace(first))
		l, err2 := netip.ParseAddr(strings.TrimSpace(last))
		if err1 != nil || err2 != nil {
			return "", false, fmt.Errorf("%q is not a range FIRST-LAST of two addresses", a)
		}
		norm := f.String() + "-" + l.String()
		return norm, norm != a, nil
	}
	p, err := netip.ParsePrefix(strings.TrimSpace(a))
	if err != nil {
		return "", false, fmt.Errorf("%q is neither a CIDR nor a range FIRST-LAST", a)
	}
	norm := p.Masked().String()
	return norm, norm != a, nil
}

// admit checks the translated pools the way vipcast-ccm will: a pool it
// would refuse (overlapping another, an aggregation length shorter than a
// CIDR, a bad selector) is refused here, with vipcast's message.
func (t *translation) admit() {
	a := poolspec.Admit(t.res.Pools)
	for _, r := range a.Refused {
		t.refuse("IPAddressPool "+t.opts.Namespace+"/"+r.Pool, "", "vipcast-ccm would refuse the translated IPPool (%s): %s", r.Reason, r.Message)
	}
}
