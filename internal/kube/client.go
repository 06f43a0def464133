package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// podClient lists and watches pods with a REST client that knows core/v1 only. The
// typed clientset's scheme registers every API group, which costs the agent about
// 30 MB of binary and 13 MB of resident memory more than this.
type podClient struct {
	rc *rest.RESTClient
}

func newPodClient(cfg *rest.Config) (*podClient, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register core/v1: %w", err)
	}
	c := rest.CopyConfig(cfg)
	c.APIPath = "/api"
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	// Protobuf decodes with less garbage than JSON; JSON is the fallback.
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if c.UserAgent == "" {
		c.UserAgent = "sonde"
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("rest client: %w", err)
	}
	return &podClient{rc: rc}, nil
}

func (c *podClient) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	list := &corev1.PodList{}
	err := c.rc.Get().Resource("pods").VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(list)
	return list, err
}

func (c *podClient) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rc.Get().Resource("pods").VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
}
