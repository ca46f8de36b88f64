package metallbimport

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Group is MetalLB's API group.
const Group = "metallb.io"

// The MetalLB kinds Decode reads, with the versions MetalLB 0.14 and 0.15
// serve. The types below mirror MetalLB's own (go.universe.tf/metallb/api),
// field for field, so that a field MetalLB has is never taken for a typo;
// they are copied rather than imported to keep MetalLB's dependencies out
// of vipcast's module.
const (
	KindIPAddressPool    = "IPAddressPool"
	KindBGPPeer          = "BGPPeer"
	KindBGPAdvertisement = "BGPAdvertisement"
	KindL2Advertisement  = "L2Advertisement"
	KindCommunity        = "Community"
	KindBFDProfile       = "BFDProfile"
)

// servedVersions are the versions of kind that Decode accepts; nil for a
// kind it does not read.
func servedVersions(kind string) []string {
	switch kind {
	case KindBGPPeer:
		return []string{"v1beta1", "v1beta2"}
	case KindIPAddressPool, KindBGPAdvertisement, KindL2Advertisement, KindCommunity, KindBFDProfile:
		return []string{"v1beta1"}
	}
	return nil
}

// IPAddressPool is MetalLB's metallb.io/v1beta1 IPAddressPool.
type IPAddressPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Addresses         []string           `json:"addresses"`
		AutoAssign        *bool              `json:"autoAssign,omitempty"`
		AvoidBuggyIPs     bool               `json:"avoidBuggyIPs,omitempty"`
		ServiceAllocation *ServiceAllocation `json:"serviceAllocation,omitempty"`
	} `json:"spec"`
	Status json.RawMessage `json:"status,omitempty"`
}

// ServiceAllocation is an IPAddressPool's spec.serviceAllocation.
type ServiceAllocation struct {
	Priority           int                    `json:"priority,omitempty"`
	Namespaces         []string               `json:"namespaces,omitempty"`
	NamespaceSelectors []metav1.LabelSelector `json:"namespaceSelectors,omitempty"`
	ServiceSelectors   []metav1.LabelSelector `json:"serviceSelectors,omitempty"`
}

// BGPPeer is MetalLB's BGPPeer, metallb.io/v1beta2 (v1beta1 has a subset
// of its fields, with the same names).
type BGPPeer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              BGPPeerSpec     `json:"spec"`
	Status            json.RawMessage `json:"status,omitempty"`
}

// BGPPeerSpec is a BGPPeer's spec.
type BGPPeerSpec struct {
	MyASN                  uint32                 `json:"myASN"`
	ASN                    uint32                 `json:"peerASN,omitempty"`
	DynamicASN             string                 `json:"dynamicASN,omitempty"`
	Address                string                 `json:"peerAddress,omitempty"`
	Interface              string                 `json:"interface,omitempty"`
	SrcAddress             string                 `json:"sourceAddress,omitempty"`
	Port                   uint16                 `json:"peerPort,omitempty"`
	HoldTime               *metav1.Duration       `json:"holdTime,omitempty"`
	KeepaliveTime          *metav1.Duration       `json:"keepaliveTime,omitempty"`
	ConnectTime            *metav1.Duration       `json:"connectTime,omitempty"`
	RouterID               string                 `json:"routerID,omitempty"`
	NodeSelectors          []metav1.LabelSelector `json:"nodeSelectors,omitempty"`
	Password               string                 `json:"password,omitempty"`
	PasswordSecret         SecretReference        `json:"passwordSecret,omitempty"`
	BFDProfile             string                 `json:"bfdProfile,omitempty"`
	EnableGracefulRestart  bool                   `json:"enableGracefulRestart,omitempty"`
	EBGPMultiHop           bool                   `json:"ebgpMultiHop,omitempty"`
	VRFName                string                 `json:"vrf,omitempty"`
	DisableMP              bool                   `json:"disableMP,omitempty"`
	DualStackAddressFamily bool                   `json:"dualStackAddressFamily,omitempty"`
}

// SecretReference is a BGPPeer's spec.passwordSecret.
type SecretReference struct {
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

// BGPAdvertisement is MetalLB's metallb.io/v1beta1 BGPAdvertisement.
type BGPAdvertisement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		AggregationLength      *int32                 `json:"aggregationLength,omitempty"`
		AggregationLengthV6    *int32                 `json:"aggregationLengthV6,omitempty"`
		LocalPref              uint32                 `json:"localPref,omitempty"`
		Communities            []string               `json:"communities,omitempty"`
		IPAddressPools         []string               `json:"ipAddressPools,omitempty"`
		IPAddressPoolSelectors []metav1.LabelSelector `json:"ipAddressPoolSelectors,omitempty"`
		NodeSelectors          []metav1.LabelSelector `json:"nodeSelectors,omitempty"`
		Peers                  []string               `json:"peers,omitempty"`
	} `json:"spec"`
	Status json.RawMessage `json:"status,omitempty"`
}

// L2Advertisement is MetalLB's metallb.io/v1beta1 L2Advertisement.
type L2Advertisement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		IPAddressPools         []string               `json:"ipAddressPools,omitempty"`
		IPAddressPoolSelectors []metav1.LabelSelector `json:"ipAddressPoolSelectors,omitempty"`
		NodeSelectors          []metav1.LabelSelector `json:"nodeSelectors,omitempty"`
		Interfaces             []string               `json:"interfaces,omitempty"`
	} `json:"spec"`
	Status json.RawMessage `json:"status,omitempty"`
}

// Community is MetalLB's metallb.io/v1beta1 Community: names for
// community values.
type Community struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Communities []struct {
			Name  string `json:"name,omitempty"`
			Value string `json:"value,omitempty"`
		} `json:"communities,omitempty"`
	} `json:"spec"`
	Status json.RawMessage `json:"status,omitempty"`
}

// BFDProfile is MetalLB's metallb.io/v1beta1 BFDProfile.
type BFDProfile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		ReceiveInterval  *uint32 `json:"receiveInterval,omitempty"`
		TransmitInterval *uint32 `json:"transmitInterval,omitempty"`
		DetectMultiplier *uint32 `json:"detectMultiplier,omitempty"`
		EchoInterval     *uint32 `json:"echoInterval,omitempty"`
		EchoMode         *bool   `json:"echoMode,omitempty"`
		PassiveMode      *bool   `json:"passiveMode,omitempty"`
		MinimumTTL       *uint32 `json:"minimumTtl,omitempty"`
	} `json:"spec"`
	Status json.RawMessage `json:"status,omitempty"`
}

// object is any of MetalLB's objects Decode reads.
type object interface {
	meta() (*metav1.TypeMeta, *metav1.ObjectMeta)
}

func (p *IPAddressPool) meta() (*metav1.TypeMeta, *metav1.ObjectMeta) {
	return &p.TypeMeta, &p.ObjectMeta
}
func (p *BGPPeer) meta() (*metav1.TypeMeta, *metav1.ObjectMeta) { return &p.TypeMeta, &p.ObjectMeta }
func (a *BGPAdvertisement) meta() (*metav1.TypeMeta, *metav1.ObjectMeta) {
	return &a.TypeMeta, &a.ObjectMeta
}
func (a *L2Advertisement) meta() (*metav1.TypeMeta, *metav1.ObjectMeta) {
	return &a.TypeMeta, &a.ObjectMeta
}
func (c *Community) meta() (*metav1.TypeMeta, *metav1.ObjectMeta)  { return &c.TypeMeta, &c.ObjectMeta }
func (b *BFDProfile) meta() (*metav1.TypeMeta, *metav1.ObjectMeta) { return &b.TypeMeta, &b.ObjectMeta }

// all returns every object of o, by kind in Objects' order.
func (o *Objects) all() []object {
	var out []object
	for i := range o.Pools {
		out = append(out, &o.Pools[i])
	}
	for i := range o.Peers {
		out = append(out, &o.Peers[i])
	}
	for i := range o.BGPAds {
		out = append(out, &o.BGPAds[i])
	}
	for i := range o.L2Ads {
		out = append(out, &o.L2Ads[i])
	}
	for i := range o.Communities {
		out = append(out, &o.Communities[i])
	}
	for i := range o.BFDProfiles {
		out = append(out, &o.BFDProfiles[i])
	}
	return out
}

// Objects are MetalLB's configuration, as Decode read it.
type Objects struct {
	Pools       []IPAddressPool
	Peers       []BGPPeer
	BGPAds      []BGPAdvertisement
	L2Ads       []L2Advertisement
	Communities []Community
	BFDProfiles []BFDProfile
	// Skipped names each document that is not a MetalLB configuration
	// object (another group, or a kind the translation does not read, such
	// as ServiceBGPStatus), which Decode passed over.
	Skipped []string
}

// Decode reads YAML or JSON documents (several in one stream, and List
// objects such as `kubectl get -o yaml` prints) from r and adds MetalLB's
// configuration objects among them to o. source names r in errors. A
// MetalLB object with a field MetalLB does not have, or a value of the
// wrong type, is an error naming the source, the object and the field; so
// is a MetalLB kind at a version MetalLB 0.14–0.15 does not serve.
func (o *Objects) Decode(r io.Reader, source string) error {
	d := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	for doc := 1; ; doc++ {
		var raw json.RawMessage
		if err := d.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("%s, document %d: %w", source, doc, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
			continue
		}
		if err := o.add(raw, fmt.Sprintf("%s, document %d", source, doc)); err != nil {
			return err
		}
	}
}

// add decodes one object (a List's items each in turn).
func (o *Objects) add(raw json.RawMessage, where string) error {
	var head struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return fmt.Errorf("%s: not a Kubernetes object: %w", where, err)
	}
	if head.Kind == "List" || strings.HasSuffix(head.Kind, "List") && head.Items != nil {
		for i, item := range head.Items {
			if err := o.add(item, fmt.Sprintf("%s, item %d", where, i+1)); err != nil {
				return err
			}
		}
		return nil
	}
	group, version, _ := strings.Cut(head.APIVersion, "/")
	name := head.Kind + " " + head.Metadata.Namespace + "/" + head.Metadata.Name
	if head.Metadata.Namespace == "" {
		name = head.Kind + " " + head.Metadata.Name
	}
	if group != Group {
		o.Skipped = append(o.Skipped, fmt.Sprintf("%s (%s): not a %s object", name, where, Group))
		return nil
	}
	vs := servedVersions(head.Kind)
	if vs == nil {
		o.Skipped = append(o.Skipped, fmt.Sprintf("%s (%s): not configuration the translation reads", name, where))
		return nil
	}
	if !slices.Contains(vs, version) {
		return fmt.Errorf("%s (%s): apiVersion %s: MetalLB 0.14–0.15 serve %s at %s", name, where, head.APIVersion, head.Kind, strings.Join(vs, ", "))
	}
	if head.Metadata.Name == "" {
		return fmt.Errorf("%s (%s): metadata.name is empty", head.Kind, where)
	}
	where = name + " (" + where + ")"
	switch head.Kind {
	case KindIPAddressPool:
		return decodeInto(raw, where, &o.Pools)
	case KindBGPPeer:
		return decodeInto(raw, where, &o.Peers)
	case KindBGPAdvertisement:
		return decodeInto(raw, where, &o.BGPAds)
	case KindL2Advertisement:
		return decodeInto(raw, where, &o.L2Ads)
	case KindCommunity:
		return decodeInto(raw, where, &o.Communities)
	case KindBFDProfile:
		return decodeInto(raw, where, &o.BFDProfiles)
	}
	return nil
}

// decodeInto decodes raw strictly (no field MetalLB lacks) and appends it
// to list; where names the object in the error.
func decodeInto[T any](raw json.RawMessage, where string, list *[]T) error {
	var v T
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("%s: %w", where, fieldError(err))
	}
	*list = append(*list, v)
	return nil
}

// fieldError rewrites encoding/json's errors to name the field as a path
// in the object ("spec.autoAssign"), with what was wrong.
func fieldError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("field %s: a %s where MetalLB takes a %s", te.Field, te.Value, te.Type)
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return fmt.Errorf("field %s: MetalLB has no such field (misspelt, or from another version)", f)
	}
	return err
}
